// Speculative decoding with the n-gram drafter (runtime/drafter.h): the tokens are exactly those
// of decoding without a draft — greedy on the llama.cpp parity prompts, sampled with a seed, on a
// copy-heavy prompt where most drafts are accepted, and on the tiny Gemma 4 models — and the
// drafter really drafted (so that the comparisons are not vacuous).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "default_engine.h"
#include "kestrel/runtime/session.h"
#include "test_models.h"

namespace kestrel::runtime {
namespace {

GenerateOptions options(size_t n, DraftMode draft, float temperature = 0.0f) {
  GenerateOptions o;
  o.max_tokens = n;
  o.sampler.temperature = temperature;
  o.sampler.top_k = 40;
  o.sampler.seed = 1234;
  o.ignore_eos = true;
  o.draft = draft;
  return o;
}

// Generates `prompt` without and with drafting; the tokens must be equal. Returns the drafted run.
GenerateResult same_tokens(Engine& e, const std::vector<TokenId>& prompt, size_t n, float temperature) {
  Session plain(e), drafted(e);
  const auto a = plain.generate(prompt, options(n, DraftMode::kNone, temperature));
  const auto b = drafted.generate(prompt, options(n, DraftMode::kNgram, temperature));
  EXPECT_EQ(a.tokens, b.tokens) << "temperature " << temperature;
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.drafted_tokens, 0u);
  EXPECT_LE(b.accepted_tokens, b.drafted_tokens);
  // The cache holds what it would without drafting: the prompt and every token but the last.
  EXPECT_EQ(drafted.cached_tokens().size(), plain.cached_tokens().size());
  return b;
}

class Speculative : public WithDefaultEngine<1024> {};

TEST_F(Speculative, ParityPromptsGiveTheSameTokens) {
  std::ifstream in(std::filesystem::path(KESTREL_SOURCE_DIR) / "tests/goldens/model_llamacpp.json");
  const auto goldens = nlohmann::json::parse(in);
  size_t drafted = 0;
  const auto& refs = goldens["references"]["q4_k_m"];
  for (size_t i = 0; i < refs.size(); i += 2) {  // half the prompts greedy, a sixth sampled too (CI time)
    const auto prompt = refs[i]["tokens"].get<std::vector<TokenId>>();
    drafted += same_tokens(*engine_, prompt, 32, 0.0f).drafted_tokens;
    if (i % 6 == 0) drafted += same_tokens(*engine_, prompt, 32, 0.9f).drafted_tokens;
  }
  EXPECT_GT(drafted, 0u);
}

TEST_F(Speculative, CopyHeavyTextAcceptsMostDrafts) {
  const std::string code =
      "def moving_average(values, window):\n"
      "    out = []\n"
      "    total = 0.0\n"
      "    for i, v in enumerate(values):\n"
      "        total += v\n"
      "        if i >= window:\n"
      "            total -= values[i - window]\n"
      "        if i >= window - 1:\n"
      "            out.append(total / window)\n"
      "    return out\n";
  const auto prompt = engine_->encode("In utils.py:\n\n" + code + "\nThe same function in stats.py:\n\n" + code +
                                          "\nAnd again in metrics.py:\n\ndef moving_average(",
                                      false);
  const auto r = same_tokens(*engine_, prompt, 64, 0.0f);
  EXPECT_GT(r.drafted_tokens, 32u);
  EXPECT_GT(r.accepted_tokens * 2, r.drafted_tokens) << r.accepted_tokens << " of " << r.drafted_tokens;
  same_tokens(*engine_, prompt, 64, 0.7f);
}

TEST(SpeculativeGemma4, TinyModelsGiveTheSameTokens) {
  for (const char* name : {"e2b_tiny", "e4b_tiny"}) {
    SCOPED_TRACE(name);
    EngineOptions o;
    o.n_ctx = 256;
    o.n_threads = 2;
    Engine e(model::tiny_gemma4(name), o);
    // A repeated random phrase (window 8: the draft and its rollback cross the sliding ring).
    auto prompt = model::random_tokens(12, e.model().info().n_vocab, 5);
    for (int i = 0; i < 3; ++i) prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + 12);
    const auto r = same_tokens(e, prompt, 40, 0.0f);
    EXPECT_GT(r.drafted_tokens, 0u);
    same_tokens(e, prompt, 40, 1.0f);
  }
}

}  // namespace
}  // namespace kestrel::runtime
