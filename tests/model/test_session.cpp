// Sessions on a shared Engine (runtime/session.h): a follow-up turn that resends the
// conversation prefills only what the KV cache lacks, and answers exactly as a cold run of the
// same prompt; sessions do not disturb each other; cache_prompt off means a fresh sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kestrel/kernels/matmul.h"

#include "default_engine.h"
#include "kestrel/runtime/session.h"

namespace kestrel::runtime {
namespace {

class Sessions : public WithDefaultEngine<2048> {
 protected:
  static GenerateOptions greedy(size_t n, bool cache_prompt) {
    GenerateOptions o;
    o.max_tokens = n;
    o.sampler.temperature = 0;
    o.ignore_eos = true;
    o.cache_prompt = cache_prompt;
    return o;
  }
};

TEST_F(Sessions, FollowUpReusesTheCacheAndAnswersAsAColdRun) {
  Engine& e = *engine_;
  const auto turn1 = e.encode("The history of the printing press begins in the fifteenth century, when", false);
  Session warm(e), cold(e);
  const auto r1 = warm.generate(turn1, greedy(24, true));
  EXPECT_EQ(r1.cached_tokens, 0u);
  // The follow-up: the first prompt, the answer as generated, then new text.
  std::vector<TokenId> turn2 = turn1;
  turn2.insert(turn2.end(), r1.tokens.begin(), r1.tokens.end());
  const auto more = e.tokenizer().encode(" Later, in the sixteenth century,", false, false);
  turn2.insert(turn2.end(), more.begin(), more.end());
  // The cache holds the prompt and every generated token but the last (sampled, not fed).
  EXPECT_EQ(warm.cached_tokens().size(), turn1.size() + r1.tokens.size() - 1);

  const auto r2 = warm.generate(turn2, greedy(24, true));
  // Turn 1's prompt only: its answer's positions were written by decode steps, which round
  // otherwise than a cold run's prefill (KvCache::prefilled()); and at most all but the last
  // kTileMinTokens prompt tokens (they are prefilled as a cold run does).
  EXPECT_EQ(warm.cached_tokens().size(), turn2.size() + r2.tokens.size() - 1);
  EXPECT_EQ(r2.cached_tokens, std::min(turn1.size(), turn2.size() - kernels::kTileMinTokens));
  EXPECT_EQ(r2.prompt_tokens, turn2.size());
  const auto c2 = cold.generate(turn2, greedy(24, false));
  EXPECT_EQ(c2.cached_tokens, 0u);
  EXPECT_EQ(r2.tokens, c2.tokens);

  // The same prompt again: everything but its last kTileMinTokens tokens comes from the cache.
  const auto r3 = warm.generate(turn2, greedy(8, true));
  EXPECT_EQ(r3.cached_tokens, turn2.size() - kernels::kTileMinTokens);
  EXPECT_EQ(std::vector<TokenId>(r3.tokens.begin(), r3.tokens.end()),
            std::vector<TokenId>(c2.tokens.begin(), c2.tokens.begin() + 8));
}

TEST_F(Sessions, AnotherPromptSharesOnlyItsCommonPrefix) {
  Engine& e = *engine_;
  Session s(e);
  const auto a = e.encode("Rivers of Europe: the Danube, the Rhine and", false);
  const auto b = e.encode("Rivers of Europe: the Volga, the Loire and", false);
  s.generate(a, greedy(4, true));
  const size_t shared = model::common_prefix(a, b);
  ASSERT_GT(shared, 1u);
  const auto rb = s.generate(b, greedy(8, true));
  EXPECT_EQ(rb.cached_tokens, std::min(shared, b.size() - kernels::kTileMinTokens));
  Session fresh(e);
  EXPECT_EQ(rb.tokens, fresh.generate(b, greedy(8, false)).tokens);
}

TEST_F(Sessions, CachePromptOffStartsFresh) {
  Engine& e = *engine_;
  Session s(e);
  const auto a = e.encode("One, two, three,", false);
  s.generate(a, greedy(4, true));
  const auto r = s.generate(a, greedy(4, false));
  EXPECT_EQ(r.cached_tokens, 0u);
  EXPECT_EQ(s.cache().n_past, a.size() + 3);
}

}  // namespace
}  // namespace kestrel::runtime
