// libFuzzer target: the request translations of the Responses API and Anthropic's Messages API
// (server/responses_request.h, server/messages_request.h), the chat request parser they
// feed (server/request.h), and the /v1/embeddings reader (server/embeddings.h), on arbitrary
// bytes read as JSON.
//
// Checked invariants (a violation aborts, which libFuzzer reports as a crash):
//  * no exception but ApiError (the client's 4xx), no sanitizer report;
//  * every ApiError is a 4xx with a non-empty message;
//  * a translation that succeeds yields a body the chat parser reads (or refuses with ApiError);
//  * an embeddings request that parses has at least one input, at most kMaxEmbeddingInputs
//    texts, no empty token-id list, and a base64 encoding of 4 bytes per float.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/server/api_error.h"
#include "kestrel/server/embeddings.h"
#include "kestrel/server/messages_request.h"
#include "kestrel/server/request.h"
#include "kestrel/server/responses_request.h"

namespace {

using kestrel::server::ApiError;

void check(const ApiError& e) {
  if (e.status() < 400 || e.status() > 499 || std::string(e.what()).empty()) {
    std::fprintf(stderr, "bad ApiError %d: %s\n", e.status(), e.what());
    std::abort();
  }
}

template <typename F>
void expect_only_api_errors(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    check(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (kestrel::server::json_nesting_depth(text) > kestrel::server::kMaxJsonDepth) return 0;  // the server refuses these first
  const auto body = nlohmann::ordered_json::parse(text, nullptr, false);
  if (body.is_discarded()) return 0;
  static kestrel::server::ResponseStore store(4);
  expect_only_api_errors([&] {
    const auto r = kestrel::server::responses_to_chat(body, store);
    expect_only_api_errors([&] { kestrel::server::parse_chat_request(nlohmann::json::parse(r.chat.dump())); });
    store.put("resp_fuzz", {r.history, nlohmann::json::object()});
  });
  for (bool count_only : {false, true}) {
    expect_only_api_errors([&] {
      const auto m = kestrel::server::messages_to_chat(body, count_only);
      expect_only_api_errors([&] { kestrel::server::parse_chat_request(nlohmann::json::parse(m.chat.dump())); });
    });
  }
  expect_only_api_errors([&] {
    const auto e = kestrel::server::parse_embeddings_request(nlohmann::json::parse(text));
    const size_t n = e.inputs.texts.size() + e.inputs.ids.size();
    bool ok = n >= 1 && e.inputs.texts.size() <= kestrel::server::kMaxEmbeddingInputs;
    for (const auto& ids : e.inputs.ids) ok = ok && !ids.empty();
    if (!ok) {
      std::fprintf(stderr, "embeddings request parsed into %zu inputs, one of them empty or too many\n", n);
      std::abort();
    }
    const std::vector<float> v(n % 7, 1.0f);
    if (kestrel::server::base64_floats(v).size() != (v.size() * 4 + 2) / 3 * 4) std::abort();
  });
  return 0;
}
