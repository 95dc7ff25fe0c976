#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "kestrel/runtime/sampler.h"

using kestrel::runtime::Sampler;
using kestrel::runtime::SamplerConfig;
using kestrel::runtime::TokenId;

TEST(Sampler, GreedyTakesArgmaxLowestIdOnTies) {
  SamplerConfig c;
  c.temperature = 0;
  Sampler s(c);
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(logits, {}), 1);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplerConfig c;
  c.temperature = 0;
  c.repeat_penalty = 2.0f;
  Sampler s(c);
  // Token 0 (3.0 -> 1.5) loses to token 1 (2.0); token 2 (-1 -> -2) stays below.
  std::vector<float> logits = {3.0f, 2.0f, -1.0f};
  const std::vector<TokenId> history = {0, 2};
  EXPECT_EQ(s.sample(logits, history), 1);
  EXPECT_FLOAT_EQ(logits[0], 1.5f);
  EXPECT_FLOAT_EQ(logits[2], -2.0f);
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplerConfig c;
  c.temperature = 1.0f;
  c.top_k = 1;
  Sampler s(c);
  std::vector<float> logits = {0.1f, 0.3f, 0.2f};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits, {}), 1);
}

TEST(Sampler, FrequenciesFollowSoftmaxAndSeedRepeats) {
  SamplerConfig c;
  c.temperature = 1.0f;
  c.top_k = 0;
  c.top_p = 1.0f;
  c.min_p = 0.0f;
  c.seed = 7;
  // p = softmax(log(0.5), log(0.3), log(0.2)) = (0.5, 0.3, 0.2).
  const std::vector<float> base = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler a(c), b(c);
  std::map<TokenId, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    std::vector<float> la = base, lb = base;
    const TokenId ta = a.sample(la, {});
    EXPECT_EQ(ta, b.sample(lb, {}));
    ++counts[ta];
  }
  EXPECT_NEAR(counts[0] / double(n), 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double(n), 0.2, 0.02);
}

TEST(Sampler, TopPAndMinPCut) {
  SamplerConfig c;
  c.temperature = 1.0f;
  c.top_k = 0;
  c.min_p = 0.0f;
  c.top_p = 0.5f;  // the first token alone reaches 0.5
  Sampler s(c);
  const std::vector<float> base = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l = base;
    EXPECT_EQ(s.sample(l, {}), 0);
  }
  c.top_p = 1.0f;
  c.min_p = 0.5f;  // keeps p >= 0.25: tokens 0 and 1
  Sampler m(c);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> l = base;
    EXPECT_NE(m.sample(l, {}), 2);
  }
}
