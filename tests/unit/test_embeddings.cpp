// /v1/embeddings on the wire (server/embeddings.h) and the pooling of hidden rows
// (runtime/pooling.h). The vectors themselves are checked against llama.cpp in
// tests/python/test_serve_embeddings.py.
#include <gtest/gtest.h>

#include <cmath>

#include "kestrel/base/error.h"
#include "kestrel/runtime/pooling.h"
#include "kestrel/server/api_error.h"
#include "kestrel/server/embeddings.h"

using nlohmann::json;
using namespace kestrel;

namespace {

// The 400's param for a body, or "" when it is accepted.
std::string error_param(const std::string& body) {
  try {
    server::parse_embeddings_request(json::parse(body));
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    return e.body()["error"]["param"].is_null() ? "(none)" : e.body()["error"]["param"].get<std::string>();
  }
  return "";
}

}  // namespace

TEST(EmbeddingsRequest, ReadsEveryInputShape) {
  EXPECT_EQ(server::parse_embeddings_request(json::parse(R"({"input":"a"})")).inputs.texts,
            std::vector<std::string>{"a"});
  EXPECT_EQ(server::parse_embeddings_request(json::parse(R"({"input":["a","b"]})")).inputs.texts.size(), 2u);
  const auto ids = server::parse_embeddings_request(json::parse(R"({"input":[2,5,9]})")).inputs.ids;
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(ids[0], (std::vector<int32_t>{2, 5, 9}));
  EXPECT_EQ(server::parse_embeddings_request(json::parse(R"({"input":[[2],[2,3]]})")).inputs.ids.size(), 2u);
  const auto r = server::parse_embeddings_request(
      json::parse(R"({"input":"a","encoding_format":"base64","dimensions":640,"model":"m","user":"u"})"));
  EXPECT_TRUE(r.base64);
  EXPECT_EQ(r.dimensions, 640);
  EXPECT_EQ(r.model, "m");
}

TEST(EmbeddingsRequest, RefusesMalformedBodiesNamingTheField) {
  EXPECT_EQ(error_param("[1]"), "(none)");
  EXPECT_EQ(error_param("{}"), "input");
  EXPECT_EQ(error_param(R"({"input":[]})"), "input");
  EXPECT_EQ(error_param(R"({"input":[[]]})"), "input");
  EXPECT_EQ(error_param(R"({"input":[-1]})"), "input");
  EXPECT_EQ(error_param(R"({"input":["a",1]})"), "input");
  EXPECT_EQ(error_param(R"({"input":{"a":1}})"), "input");
  EXPECT_EQ(error_param(R"({"input":"a","encoding_format":"int8"})"), "encoding_format");
  EXPECT_EQ(error_param(R"({"input":"a","dimensions":0})"), "dimensions");
  EXPECT_EQ(error_param(R"({"input":"a","model":3})"), "model");
  json many = {{"input", json::array()}};
  for (size_t i = 0; i <= server::kMaxEmbeddingInputs; ++i) many["input"].push_back("x");
  EXPECT_EQ(error_param(many.dump()), "input");
}

TEST(EmbeddingsResponse, Base64IsLittleEndianFloat32) {
  // Python: base64.b64encode(struct.pack('<3f', 1.0, -2.5, 0.1))
  const std::vector<float> v{1.0f, -2.5f, 0.1f};
  EXPECT_EQ(server::base64_floats(v), "AACAPwAAIMDNzMw9");
  EXPECT_EQ(server::base64_floats(std::vector<float>{1.0f}), "AACAPw==");
  const json r = server::embeddings_response({v, v}, false, "m", 7);
  EXPECT_EQ(r["object"], "list");
  EXPECT_EQ(r["data"][1]["index"], 1);
  EXPECT_EQ(r["data"][1]["object"], "embedding");
  EXPECT_FLOAT_EQ(r["data"][0]["embedding"][1].get<float>(), -2.5f);
  EXPECT_EQ(r["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(r["usage"]["total_tokens"], 7);
}

TEST(HiddenPool, MeanLastAndClsOfRowsFedInPieces) {
  // Three rows of width 2, fed as 2 + 1 rows.
  const float rows[] = {3, 4, 0, 2, 6, 0};
  auto pooled = [&](runtime::Pooling p) {
    runtime::HiddenPool pool(p, 2);
    pool.add(rows, 2);
    pool.add(rows + 4, 1);
    EXPECT_EQ(pool.tokens(), 3u);
    return pool.finish();
  };
  const auto mean = pooled(runtime::Pooling::kMean);  // (9, 6) / 3 -> normalized (3, 2) / sqrt(13)
  EXPECT_NEAR(mean[0], 3 / std::sqrt(13.0), 1e-6);
  EXPECT_NEAR(mean[1], 2 / std::sqrt(13.0), 1e-6);
  const auto last = pooled(runtime::Pooling::kLast);
  EXPECT_FLOAT_EQ(last[0], 1.0f);
  EXPECT_FLOAT_EQ(last[1], 0.0f);
  const auto cls = pooled(runtime::Pooling::kCls);  // (3, 4) / 5
  EXPECT_NEAR(cls[0], 0.6, 1e-6);
  EXPECT_NEAR(cls[1], 0.8, 1e-6);
  EXPECT_THROW(runtime::HiddenPool(runtime::Pooling::kNone, 2), Error);
  EXPECT_THROW(runtime::HiddenPool(runtime::Pooling::kMean, 2).finish(), Error);
  EXPECT_THROW(runtime::parse_pooling("rank"), Error);
  EXPECT_EQ(runtime::parse_pooling("cls"), runtime::Pooling::kCls);
}
