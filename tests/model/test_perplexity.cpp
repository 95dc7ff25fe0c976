// Perplexity and KL divergence on the real default model.
//
// Golden: tests/goldens/perplexity.json, made by scripts/goldens/make_perplexity_goldens.py:
// llama.cpp (llama-cpp-python) evaluates wikitext-2's test set chunk by chunk as
// llama-perplexity does, and numpy scores its logits. The strict reference is llama.cpp on the
// float32 re-encoding of the model (the same model in the same precision as Kestrel; see
// docs/correctness.md); the Q4_K_M file's value is only printed.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/model_path.h"
#include "default_engine.h"
#include "kestrel/runtime/perplexity.h"
#include "source_dir.h"

namespace kestrel::runtime {
namespace {

constexpr double kRelTolerance = 0.005;  // 0.5 % of llama.cpp's (f32) perplexity
constexpr size_t kCtx = 256;
constexpr size_t kChunks = 2;

const std::filesystem::path kWikiText =
    ::kestrel::testing::source_dir() / "../shared/data/wikitext2/wiki.test.raw";

// perplexity() makes its own caches, so the engine's context can be 1.
class Perplexity : public WithDefaultEngine<1> {};

std::string some_text() {
  std::string text;
  for (int i = 0; i < 8; ++i) {
    text += "The kestrel hovers above the field, its wings beating fast while its head stays "
            "perfectly still. It watches the grass for voles and beetles, then drops. ";
    text += std::to_string(i) + " times the bird rose again over the hedges and the river.\n";
  }
  return text;
}

TEST_F(Perplexity, KlAgainstItselfIsZero) {
  const auto tokens = engine_->encode(some_text(), false);
  PerplexityOptions options;
  options.n_ctx = 64;
  options.max_chunks = 1;
  ASSERT_GE(tokens.size(), 2 * options.n_ctx);
  const PerplexityResult r = perplexity(*engine_, *engine_, tokens, options);
  EXPECT_EQ(r.n_chunks, 1u);
  EXPECT_EQ(r.n_scored, 64u - 32 - 1);
  EXPECT_TRUE(r.has_base);
  EXPECT_EQ(r.kl_mean, 0.0);
  EXPECT_EQ(r.kl_max, 0.0);
  EXPECT_EQ(r.kl_p99, 0.0);
  EXPECT_EQ(r.same_top1_pct, 100.0);
  EXPECT_DOUBLE_EQ(r.ppl, r.base_ppl);
  EXPECT_GT(r.ppl, 1.0);
  // The same numbers without a base.
  const PerplexityResult alone = perplexity(*engine_, tokens, options);
  EXPECT_DOUBLE_EQ(alone.ppl, r.ppl);
  EXPECT_DOUBLE_EQ(alone.ppl_error, r.ppl_error);
  EXPECT_FALSE(alone.has_base);
}

TEST_F(Perplexity, ClearErrors) {
  const auto tokens = engine_->encode(some_text(), false);
  PerplexityOptions options;
  options.n_ctx = tokens.size();  // one chunk's worth: needs 2 x context
  try {
    perplexity(*engine_, tokens, options);
    FAIL() << "expected kestrel::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs at least " + std::to_string(2 * tokens.size())),
              std::string::npos)
        << e.what();
  }
  options.n_ctx = engine_->model().info().context_length + 1;
  EXPECT_THROW(perplexity(*engine_, tokens, options), Error);
  options.n_ctx = 3;
  EXPECT_THROW(perplexity(*engine_, tokens, options), Error);
}

TEST_F(Perplexity, MatchesLlamaCppOnWikiText2) {
  if (!std::filesystem::exists(kWikiText)) GTEST_SKIP() << kWikiText << " is missing";
  std::ifstream gin(::kestrel::testing::source_dir() / "tests/goldens/perplexity.json");
  ASSERT_TRUE(gin) << "tests/goldens/perplexity.json is missing";
  const nlohmann::json golden = nlohmann::json::parse(gin);

  // llama.cpp's value after kChunks chunks, from its per-chunk sums.
  auto reference = [&](const char* name) {
    const auto& chunks = golden["references"][name][std::to_string(kCtx)]["chunks"];
    double sum = 0, sum2 = 0;
    size_t count = 0;
    for (size_t i = 0; i < kChunks; ++i) {
      sum += chunks.at(i)["sum_nll"].get<double>();
      sum2 += chunks.at(i)["sum_nll2"].get<double>();
      count += chunks.at(i)["count"].get<size_t>();
    }
    return std::make_pair(estimate_perplexity(sum, sum2, count), count);
  };
  const auto [f32, f32_count] = reference("f32");
  const auto [q4, q4_count] = reference("q4_k_m");

  // Tokenizing the whole file takes about a second; its first lines give the same leading
  // tokens (checked against llama.cpp's ids of the whole file below).
  std::ifstream in(kWikiText, std::ios::binary);
  std::string text, line;
  while (text.size() < 16000 && std::getline(in, line)) text += line + "\n";
  const auto tokens = engine_->encode(text, false);
  const auto& first_tokens = golden["first_tokens"];
  ASSERT_GE(tokens.size(), kChunks * kCtx);
  ASSERT_GE(first_tokens.size(), kChunks * kCtx);
  for (size_t i = 0; i < kChunks * kCtx; ++i) {
    ASSERT_EQ(tokens[i], first_tokens[i].get<int>()) << "token " << i;
  }

  PerplexityOptions options;
  options.n_ctx = kCtx;
  options.max_chunks = kChunks;
  const PerplexityResult r = perplexity(*engine_, tokens, options);
  EXPECT_EQ(r.n_chunks, kChunks);
  EXPECT_EQ(r.n_scored, f32_count);
  EXPECT_NEAR(r.ppl, f32.ppl, kRelTolerance * f32.ppl);
  EXPECT_NEAR(r.ppl_error, f32.error, kRelTolerance * 4 * f32.error);
  std::printf("perplexity, %zu chunks of %zu: kestrel %.4f +/- %.4f, llama.cpp f32 %.4f, "
              "llama.cpp q4_k_m %.4f (%zu positions)\n",
              kChunks, kCtx, r.ppl, r.ppl_error, f32.ppl, q4.ppl, q4_count);
}

}  // namespace
}  // namespace kestrel::runtime
