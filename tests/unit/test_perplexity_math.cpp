// The math behind `kestrel perplexity` on hand-computed examples (no model needed).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/runtime/perplexity.h"

namespace kestrel::runtime {
namespace {

TEST(PerplexityMath, LogSumExpAndLogSoftmax) {
  const std::vector<float> x = {1.0f, 2.0f, 3.0f};
  // log(e + e^2 + e^3) = 3 + log(1 + e^-1 + e^-2)
  const double lse = 3.0 + std::log(1.0 + std::exp(-1.0) + std::exp(-2.0));
  EXPECT_NEAR(lse, 3.40760596444438, 1e-13);
  EXPECT_NEAR(log_sum_exp(x), lse, 1e-13);
  const auto ls = log_softmax(x);
  ASSERT_EQ(ls.size(), 3u);
  EXPECT_NEAR(ls[0], -2.40760596444438, 1e-13);
  EXPECT_NEAR(ls[1], -1.40760596444438, 1e-13);
  EXPECT_NEAR(ls[2], -0.40760596444438, 1e-13);
  EXPECT_NEAR(std::exp(ls[0]) + std::exp(ls[1]) + std::exp(ls[2]), 1.0, 1e-15);
  EXPECT_NEAR(negative_log_likelihood(x, 0), 2.40760596444438, 1e-13);
  EXPECT_NEAR(negative_log_likelihood(x, 2), 0.40760596444438, 1e-13);
  EXPECT_THROW(negative_log_likelihood(x, 3), Error);
}

TEST(PerplexityMath, LargeLogitsDoNotOverflow) {
  const std::vector<float> x = {1000.0f, 1000.0f};
  EXPECT_NEAR(log_sum_exp(x), 1000.0 + std::log(2.0), 1e-12);
  EXPECT_NEAR(negative_log_likelihood(x, 1), std::log(2.0), 1e-12);
}

TEST(PerplexityMath, KlDivergence) {
  // P = softmax(0, 0) = (1/2, 1/2), Q = softmax(0, 1) = (1/(1+e), e/(1+e)).
  // KL(P||Q) = 1/2 log((1+e)/2) + 1/2 log((1+e)/(2e)) = log((1+e)/2) - 1/2 = 0.1201145...
  const std::vector<float> p = {0.0f, 0.0f};
  const std::vector<float> q = {0.0f, 1.0f};
  const double e = std::exp(1.0);
  EXPECT_NEAR(kl_divergence(p, q), std::log((1 + e) / 2) - 0.5, 1e-14);
  EXPECT_NEAR(kl_divergence(p, q), 0.120114506, 1e-9);
  // KL(Q||P) = q1 log(2 q1) + q2 log(2 q2): not symmetric.
  const double q1 = 1 / (1 + e), q2 = e / (1 + e);
  EXPECT_NEAR(kl_divergence(q, p), q1 * std::log(2 * q1) + q2 * std::log(2 * q2), 1e-14);
  EXPECT_GT(std::abs(kl_divergence(q, p) - kl_divergence(p, q)), 1e-3);
}

TEST(PerplexityMath, KlOfIdenticalAndShiftedLogitsIsZero) {
  const std::vector<float> x = {-3.5f, 0.25f, 7.0f, 2.0f, -20.0f};
  EXPECT_EQ(kl_divergence(x, x), 0.0);
  std::vector<float> shifted = x;
  for (float& v : shifted) v += 4.0f;  // softmax is shift-invariant
  EXPECT_NEAR(kl_divergence(x, shifted), 0.0, 1e-12);
  EXPECT_GE(kl_divergence(x, shifted), 0.0);
  EXPECT_THROW(kl_divergence(x, std::vector<float>{1.0f}), Error);
}

TEST(PerplexityMath, PercentileAsLlamaCpp) {
  const std::vector<double> v = {1, 2, 3, 4, 5};
  EXPECT_DOUBLE_EQ(percentile(v, 0.0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 0.5), 3);
  EXPECT_NEAR(percentile(v, 0.99), 4.96, 1e-12);  // at 0.99 * 4 = 3.96: 0.04 * 4 + 0.96 * 5
  EXPECT_DOUBLE_EQ(percentile(v, 1.0), 5);
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{7}, 0.99), 7);
}

TEST(PerplexityMath, EstimateAsLlamaCpp) {
  // NLLs 1, 2, 3: mean 2, var = 14/3 - 4 = 2/3, error = e^2 sqrt((2/3) / 2).
  const auto e = estimate_perplexity(6, 14, 3);
  EXPECT_NEAR(e.ppl, std::exp(2.0), 1e-12);
  EXPECT_NEAR(e.error, std::exp(2.0) * std::sqrt(1.0 / 3.0), 1e-12);
  const auto zero = estimate_perplexity(0, 0, 0);
  EXPECT_EQ(zero.ppl, 0);
}

}  // namespace
}  // namespace kestrel::runtime
