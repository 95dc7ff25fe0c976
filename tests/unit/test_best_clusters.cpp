// FlashHead stage 1's selection (head::best_indices) against std::nth_element with the
// comparison search() used before it: larger score first, the lower index on ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "kestrel/head/best_clusters.h"

namespace kestrel::head {
namespace {

std::vector<uint32_t> reference(const std::vector<float>& s, size_t k) {
  std::vector<uint32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                   [&](uint32_t a, uint32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(BestIndices, EqualsNthElementOnScoresWithTiesSignedZerosAndOneBucket) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> small(-4, 4);
  std::vector<uint32_t> best;
  for (int shape = 0; shape < 5; ++shape) {
    for (size_t n : {size_t{1}, size_t{17}, size_t{1000}, size_t{16384}}) {
      std::vector<float> s(n);
      for (size_t i = 0; i < n; ++i) {
        switch (shape) {
          case 0: s[i] = normal(rng); break;                                    // distinct
          case 1: s[i] = static_cast<float>(small(rng)); break;                // many ties
          case 2: s[i] = small(rng) == 0 ? -0.0f : (small(rng) > 0 ? 0.0f : 1.0f); break;  // -0 / +0
          case 3: s[i] = 1.0f + 1e-7f * static_cast<float>(i % 5); break;      // one radix bucket
          default: s[i] = -std::abs(normal(rng)); break;                       // all negative
        }
      }
      for (size_t k : {size_t{1}, size_t{2}, n / 16 + 1, n / 2 + 1, n - 1, n}) {
        if (k == 0 || k > n) continue;
        best_indices(s.data(), n, k, best);
        EXPECT_EQ(best, reference(s, k)) << "shape " << shape << ", n " << n << ", k " << k;
      }
    }
  }
}

TEST(BestIndices, ZeroAndMoreThanNSelectNoneAndAll) {
  const std::vector<float> s = {3.0f, 1.0f, 2.0f};
  std::vector<uint32_t> best = {9};
  best_indices(s.data(), s.size(), 0, best);
  EXPECT_TRUE(best.empty());
  best_indices(s.data(), s.size(), 5, best);
  EXPECT_EQ(best, (std::vector<uint32_t>{0, 1, 2}));
}

}  // namespace
}  // namespace kestrel::head
