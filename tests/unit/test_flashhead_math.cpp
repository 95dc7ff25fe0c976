// FlashHead's offline clustering and the sampler over sparse (candidate) scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "kestrel/base/error.h"
#include "kestrel/head/clustering.h"
#include "kestrel/head/flashhead.h"
#include "kestrel/runtime/flashhead_eval.h"
#include "kestrel/runtime/logprobs.h"
#include "kestrel/runtime/sampler.h"
#include "random_vector.h"

namespace kestrel::head {
namespace {

std::vector<float> random_rows(size_t n, size_t d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> x(n * d);
  for (auto& v : x) v = g(rng);
  return x;
}

void expect_balanced(const Clustering& c, size_t n_rows) {
  ASSERT_EQ(c.order.size(), n_rows);
  ASSERT_EQ(c.n_clusters * c.cluster_size, n_rows);
  std::vector<int> seen(n_rows, 0);
  for (int32_t r : c.order) ++seen[static_cast<size_t>(r)];
  for (size_t r = 0; r < n_rows; ++r) ASSERT_EQ(seen[r], 1) << "row " << r;
  for (size_t k = 0; k < c.n_clusters; ++k) {  // each cluster's rows ascending
    for (size_t i = 1; i < c.cluster_size; ++i) {
      ASSERT_LT(c.order[k * c.cluster_size + i - 1], c.order[k * c.cluster_size + i]);
    }
  }
}

TEST(Clustering, EveryClusterHoldsExactlyClusterSizeRows) {
  // 4096 rows into 256 clusters of 16: two levels (16 groups of 16 clusters).
  const size_t n = 4096, d = 64;
  const auto x = random_rows(n, d, 1);
  ThreadPool pool(2);
  ClusteringOptions o;
  o.cluster_size = 16;
  const Clustering c = cluster_rows(x.data(), n, d, o, pool);
  EXPECT_EQ(c.n_clusters, 256u);
  expect_balanced(c, n);
  ASSERT_EQ(c.centroids.size(), 256u * d);
  // The stage-1 centroid is the mean of the cluster's rows.
  for (size_t j = 0; j < d; ++j) {
    double mean = 0;
    for (size_t i = 0; i < 16; ++i) mean += x[static_cast<size_t>(c.order[i]) * d + j];
    EXPECT_NEAR(c.centroids[j], mean / 16, 1e-5);
  }
}

TEST(Clustering, DeterministicForASeedAndAnyThreadCount) {
  const size_t n = 2048, d = 32;
  const auto x = random_rows(n, d, 2);
  ClusteringOptions o;
  o.cluster_size = 8;
  o.seed = 7;
  ThreadPool one(1), two(2), three(3);
  const Clustering a = cluster_rows(x.data(), n, d, o, one);
  const Clustering b = cluster_rows(x.data(), n, d, o, two);
  const Clustering c = cluster_rows(x.data(), n, d, o, three);
  EXPECT_EQ(a.order, b.order);
  EXPECT_EQ(a.order, c.order);
  o.seed = 8;
  EXPECT_NE(cluster_rows(x.data(), n, d, o, two).order, a.order);
}

TEST(Clustering, RecoversPlantedDirections) {
  // 128 random directions, 16 rows each scattered tightly around it at different lengths:
  // the balanced spherical clustering must put each group in one cluster.
  const size_t k = 128, cap = 16, d = 48, n = k * cap;
  const auto centers = random_rows(k, d, 3);
  std::mt19937_64 rng(4);
  std::normal_distribution<float> noise(0.0f, 0.02f);
  std::uniform_real_distribution<float> length(0.5f, 3.0f);
  std::vector<float> x(n * d);
  std::vector<size_t> truth(n);
  std::vector<size_t> shuffled(n);
  for (size_t i = 0; i < n; ++i) shuffled[i] = i;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (size_t i = 0; i < n; ++i) {
    const size_t row = shuffled[i], g = i / cap;
    truth[row] = g;
    const float len = length(rng);
    for (size_t j = 0; j < d; ++j) x[row * d + j] = len * (centers[g * d + j] + noise(rng));
  }
  ThreadPool pool(2);
  ClusteringOptions o;
  o.cluster_size = cap;
  o.iterations = 10;
  const Clustering c = cluster_rows(x.data(), n, d, o, pool);
  expect_balanced(c, n);
  size_t pure = 0;
  for (size_t cl = 0; cl < k; ++cl) {
    std::set<size_t> groups;
    for (size_t i = 0; i < cap; ++i) groups.insert(truth[static_cast<size_t>(c.order[cl * cap + i])]);
    pure += groups.size() == 1;
  }
  EXPECT_GE(pure, k * 95 / 100) << pure << " of " << k << " clusters pure";
  EXPECT_GT(c.mean_cosine, 0.9);
}

TEST(Clustering, RefusesAClusterSizeThatDoesNotDivideTheRows) {
  const auto x = random_rows(100, 8, 5);
  ThreadPool pool(1);
  ClusteringOptions o;
  o.cluster_size = 16;
  EXPECT_THROW(cluster_rows(x.data(), 100, 8, o, pool), Error);
  o.cluster_size = 0;
  EXPECT_THROW(cluster_rows(x.data(), 100, 8, o, pool), Error);
}

TEST(Candidates, GreedyTakesTheLowestIdOnTies) {
  Candidates c;
  c.ids = {9, 4, 7};
  c.logits = {1.0f, 2.0f, 2.0f};
  EXPECT_EQ(greedy(c), 4);
  c.clear();
  EXPECT_THROW(greedy(c), Error);
}

}  // namespace
}  // namespace kestrel::head

namespace kestrel::runtime {
namespace {

TEST(SparseSampler, SameDistributionAsDenseLogitsWithTheRestAtMinusInfinity) {
  // Candidates {3, 7, 1}; the dense equivalent has every other token at -inf.
  std::vector<float> dense(10, -INFINITY);
  dense[3] = 2.0f;
  dense[7] = 1.5f;
  dense[1] = 0.5f;
  std::vector<float> sparse_logits = {2.0f, 1.5f, 0.5f};
  const std::vector<TokenId> ids = {3, 7, 1};
  SamplerConfig c;
  c.temperature = 0.7f;
  c.top_k = 0;
  c.top_p = 1.0f;
  c.min_p = 0.0f;
  c.repeat_penalty = 1.3f;
  const std::vector<TokenId> history = {7};
  Sampler a(c), b(c);
  const auto pd = a.distribution(TokenScores{dense, {}}, history);
  const auto ps = b.distribution(TokenScores{sparse_logits, ids}, history);
  // -inf tokens get weight exp(-inf) = 0 in the dense distribution.
  double mass = 0;
  for (const auto& [t, p] : ps) mass += p;
  EXPECT_NEAR(mass, 1.0, 1e-12);
  EXPECT_NEAR(total_variation(pd, ps), 0.0, 1e-12);
  // The penalty hit token 7: 1.5 / 1.3 < 1.5, so token 7's share is below its unpenalized share.
  EXPECT_EQ(ps[0].first, 3);
  EXPECT_EQ(ps[1].first, 7);
  EXPECT_NEAR(ps[1].second / ps[0].second, std::exp((1.5 / 1.3 - 2.0) / 0.7), 1e-6);
}

TEST(SparseSampler, GreedyAndSeededSamplingReturnCandidateIds) {
  std::vector<float> logits = {0.1f, 3.0f, 3.0f};
  const std::vector<TokenId> ids = {50, 20, 40};
  SamplerConfig greedy;
  greedy.temperature = 0;
  EXPECT_EQ(Sampler(greedy).sample(TokenScores{logits, ids}, {}), 20);  // tie: lower id
  SamplerConfig hot;
  hot.temperature = 1.0f;
  hot.top_k = 0;
  hot.min_p = 0;
  Sampler s(hot);
  for (int i = 0; i < 50; ++i) {
    const TokenId t = s.sample(TokenScores{logits, ids}, {});
    EXPECT_TRUE(t == 50 || t == 20 || t == 40);
  }
}

TEST(SparseSampler, TotalVariation) {
  EXPECT_DOUBLE_EQ(total_variation({{1, 0.5}, {2, 0.5}}, {{1, 0.5}, {3, 0.5}}), 0.5);
  EXPECT_DOUBLE_EQ(total_variation({{1, 1.0}}, {{1, 1.0}}), 0.0);
  EXPECT_DOUBLE_EQ(total_variation({{1, 1.0}}, {{2, 1.0}}), 1.0);
}

// The sampling coverage of flashhead-eval (issue 42): the dense top-p nucleus and whether a
// candidate set holds it.

TEST(TopPCoverage, SoftmaxAtTemperatureOne) {
  const std::vector<float> logits = {1.0f, -INFINITY, 3.0f, 1.0f};
  const auto p = softmax(logits);
  ASSERT_EQ(p.size(), 4u);
  const double sum = 2 * std::exp(1.0) + std::exp(3.0);
  EXPECT_NEAR(p[0], std::exp(1.0) / sum, 1e-15);
  EXPECT_EQ(p[1], 0.0);
  EXPECT_NEAR(p[2], std::exp(3.0) / sum, 1e-15);
  EXPECT_EQ(p[0], p[3]);
  EXPECT_THROW(softmax(std::vector<float>{}), Error);
  EXPECT_THROW(softmax(std::vector<float>{-INFINITY}), Error);
}

TEST(TopPCoverage, NucleusIsTheSmallestPrefixThatReachesPTiesToTheLowerId) {
  // Exact binary fractions, so every cumulative sum is exact: 1 (0.5), then 0 and 2 (0.25 each,
  // 0 first), then 3 (0).
  const std::vector<double> p = {0.25, 0.5, 0.25, 0.0};
  using Ids = std::vector<TokenId>;
  EXPECT_EQ(top_p_nucleus(p, 0.1), Ids({1}));
  EXPECT_EQ(top_p_nucleus(p, 0.5), Ids({1}));     // reaching p is enough ("> p" would take 0 too)
  EXPECT_EQ(top_p_nucleus(p, 0.6), Ids({1, 0}));  // the tie: the lower id first
  EXPECT_EQ(top_p_nucleus(p, 0.75), Ids({1, 0}));
  EXPECT_EQ(top_p_nucleus(p, 0.8), Ids({1, 0, 2}));
  EXPECT_EQ(top_p_nucleus(p, 1.0), Ids({1, 0, 2}));  // the zero-probability token is not needed
  EXPECT_THROW(top_p_nucleus(p, 0.0), Error);
  EXPECT_THROW(top_p_nucleus(p, 1.5), Error);
  EXPECT_THROW(top_p_nucleus(p, std::nan("")), Error);
  EXPECT_THROW(top_p_nucleus(std::vector<double>{}, 0.5), Error);
}

TEST(TopPCoverage, NucleusEqualsAFullSortOnLargeFlatDistributions) {
  // Flat distributions over 20,000 tokens (nuclei of thousands: the selection widens past its
  // first rounds), logits rounded to 1/8 so that many probabilities tie; the reference sorts
  // every token (stable: the lower id first among equals) and sums from the top.
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    auto logits = ::kestrel::testing::random_vector(20000, seed, 0.5f * static_cast<float>(seed));
    for (float& x : logits) x = std::round(x * 8.0f) / 8.0f;
    const auto probs = softmax(logits);
    std::vector<TokenId> order(probs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<TokenId>(i);
    std::stable_sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
      return probs[static_cast<size_t>(a)] > probs[static_cast<size_t>(b)];
    });
    for (double top_p : {0.01, 0.5, 0.9, 0.95, 0.99}) {
      size_t m = 0;
      for (double cumulative = 0; m < order.size() && cumulative < top_p; ++m) {
        cumulative += probs[static_cast<size_t>(order[m])];
      }
      const std::vector<TokenId> expected(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(m));
      EXPECT_EQ(top_p_nucleus(probs, top_p), expected) << "seed " << seed << ", p " << top_p;
    }
  }
}

TEST(TopPCoverage, CoveredOnlyWhenEveryNucleusTokenIsACandidate) {
  // e^3 (tokens 2 and 4, tied), e^2 (0), e^1 (1), e^0 (3): probabilities 0.3917, 0.3917, 0.1441,
  // 0.0530, 0.0195, cumulative 0.3917, 0.7834, 0.9275, 0.9805, 1.
  const std::vector<float> logits = {2.0f, 1.0f, 3.0f, 0.0f, 3.0f};
  const auto probs = softmax(logits);
  const double sum = std::exp(2.0) + std::exp(1.0) + 2 * std::exp(3.0) + 1.0;
  const double p1 = std::exp(1.0) / sum, p3 = 1.0 / sum;
  using Ids = std::vector<TokenId>;
  const auto nucleus = top_p_nucleus(probs, 0.95);
  EXPECT_EQ(nucleus, Ids({2, 4, 0, 1}));

  auto c = nucleus_cover(probs, nucleus, Ids({4, 1, 2, 0}));  // the nucleus exactly, in any order
  EXPECT_TRUE(c.covered);
  EXPECT_NEAR(c.missed_mass, p3, 1e-15);
  c = nucleus_cover(probs, nucleus, Ids({0, 2, 3, 4}));  // token 1 (5.3 %) missing
  EXPECT_FALSE(c.covered);
  EXPECT_NEAR(c.missed_mass, p1, 1e-15);
  c = nucleus_cover(probs, nucleus, Ids({3, 2, 4, 0, 1, 2}));  // every token (2 twice)
  EXPECT_TRUE(c.covered);
  EXPECT_EQ(c.missed_mass, 0.0);

  // p 0.9: the nucleus ends at token 0 (0.9275), so token 1 may be missing.
  const auto n90 = top_p_nucleus(probs, 0.9);
  EXPECT_EQ(n90, Ids({2, 4, 0}));
  c = nucleus_cover(probs, n90, Ids({0, 2, 4}));
  EXPECT_TRUE(c.covered);
  EXPECT_NEAR(c.missed_mass, p1 + p3, 1e-15);

  // p 0.3: token 2 alone (tied with 4, the lower id); a set with 4 but not 2 misses it.
  const auto n30 = top_p_nucleus(probs, 0.3);
  EXPECT_EQ(n30, Ids({2}));
  EXPECT_TRUE(nucleus_cover(probs, n30, Ids({2})).covered);
  EXPECT_FALSE(nucleus_cover(probs, n30, Ids({4, 0, 1, 3})).covered);
}

}  // namespace
}  // namespace kestrel::runtime

namespace kestrel::runtime {
namespace {

TEST(SparseLogprobs, LogSoftmaxOverTheCandidates) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  const std::vector<TokenId> ids = {500, 7, 42};
  const auto lp = compute_logprobs(logits, ids, 42, 2);
  const double log_z = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_EQ(lp.chosen.token, 42);
  EXPECT_NEAR(lp.chosen.logprob, 2.0 - log_z, 1e-6);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[0].token, 7);
  EXPECT_NEAR(lp.top[0].logprob, 3.0 - log_z, 1e-6);
  EXPECT_EQ(lp.top[1].token, 42);
  EXPECT_THROW(compute_logprobs(logits, ids, 8, 1), Error);  // not a candidate
}

}  // namespace
}  // namespace kestrel::runtime
