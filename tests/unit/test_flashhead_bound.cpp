// FlashHead's greedy-proof bound (head/flashhead_bound.h) on constructed data: every row's
// logit, as the dense head's kernel computes it (gemv_q8_rows), lies at or below its cluster's
// bound, computed from the cluster's score as stage 1's kernel computes it (gemv_q8_interleaved);
// without the radius term it does not.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/head/flashhead_bound.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/gemv_q8_rows.h"
#include "random_q8.h"

namespace k = kestrel::kernels;
namespace h = kestrel::head;

namespace {

// Q8_0 bytes of float rows [rows, cols] (round half away from zero, an fp16 scale max|v|/127 per
// 32), as the image builder quantizes centroids; any quantizer will do: the bound reads the bytes.
std::vector<uint8_t> to_q8_0(const std::vector<float>& v, size_t rows, size_t cols) {
  std::vector<uint8_t> bytes(rows * cols / 32 * 34);
  for (size_t b = 0; b < rows * cols / 32; ++b) {
    float amax = 0;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[b * 32 + i]));
    const uint16_t half = kestrel::gguf::fp32_to_fp16(amax / 127.0f);
    const float s = kestrel::gguf::fp16_to_fp32(half);
    std::memcpy(&bytes[b * 34], &half, 2);
    for (size_t i = 0; i < 32; ++i) {
      const float q = s > 0 ? std::clamp(std::round(v[b * 32 + i] / s), -127.0f, 127.0f) : 0.0f;
      bytes[b * 34 + 2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
  }
  return bytes;
}

// Clusters of 16 rows around random centers (rows = center + noise), their Q8_0 centroids the
// rows' mean, as kestrel build stores them.
struct Clustered {
  size_t k, cap = 16, d;
  std::vector<uint8_t> rows, centroids;
};

Clustered make_clusters(size_t k, size_t d, float noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g;
  Clustered c{k, 16, d, {}, {}};
  std::vector<float> rows(k * c.cap * d), mean(k * d, 0.0f);
  for (size_t ci = 0; ci < k; ++ci) {
    std::vector<float> center(d);
    for (auto& v : center) v = g(rng) * 0.05f;
    for (size_t r = 0; r < c.cap; ++r) {
      for (size_t j = 0; j < d; ++j) {
        const float v = center[j] + noise * g(rng) * 0.05f;
        rows[(ci * c.cap + r) * d + j] = v;
        mean[ci * d + j] += v / static_cast<float>(c.cap);
      }
    }
  }
  c.rows = to_q8_0(rows, k * c.cap, d);
  c.centroids = to_q8_0(mean, k, d);
  return c;
}

// For each hidden state: the largest amount by which a row's computed logit exceeds its
// cluster's bound (<= 0 when the bound holds everywhere).
double worst_excess(const Clustered& c, const h::BoundTerms& terms, size_t n_states, uint64_t seed) {
  kestrel::ThreadPool pool(1);
  const k::Matrix head = kestrel::testing::q8_0_view(c.rows, c.k * c.cap, c.d);
  const k::Matrix cents = kestrel::testing::q8_0_view(c.centroids, c.k, c.d);
  const h::ClusterBounds bounds = h::compute_cluster_bounds(head, cents, c.cap, pool);
  const k::Q8Interleaved il = k::interleave_q8_0(cents);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g;
  double worst = -1e300;
  for (size_t s = 0; s < n_states; ++s) {
    std::vector<float> x(c.d);
    for (auto& v : x) v = g(rng);
    if (s % 2 == 1) {  // a hidden state along a cluster's rows: the logits near their bound
      const size_t r = s % (c.k * c.cap);
      std::vector<float> w(c.d);
      kestrel::gguf::dequantize(kestrel::gguf::TensorType::kQ8_0, head.row(r), w.data(), c.d);
      for (size_t j = 0; j < c.d; ++j) x[j] = 0.2f * x[j] + 40.0f * w[j];
    }
    k::Q8Activations xq;
    k::quantize_q8_activations(x.data(), 1, c.d, c.d, xq);
    std::vector<float> y(c.k * c.cap), score(il.padded_rows());
    k::gemv_q8_rows(head, xq, 0, 1, y.data(), y.size(), 0, head.rows);
    k::gemv_q8_interleaved(il, xq, score.data(), score.size(), 0, c.k);
    std::vector<double> ub(c.k);
    h::cluster_upper_bounds({score.data(), c.k}, bounds.radius.data(), bounds.norm.data(),
                            h::activation_norm_bound(xq, 0), h::rounding_gamma(c.d), terms, ub.data());
    for (size_t r = 0; r < head.rows; ++r) worst = std::max(worst, static_cast<double>(y[r]) - ub[r / c.cap]);
  }
  return worst;
}

TEST(FlashHeadBound, EveryRowLiesBelowItsClustersBound) {
  for (float noise : {0.0f, 0.3f, 1.0f}) {
    const Clustered c = make_clusters(32, 640, noise, 11);
    EXPECT_LE(worst_excess(c, {}, 40, 5), 0.0) << "noise " << noise;
  }
}

TEST(FlashHeadBound, WithoutTheRadiusTermRowsExceedIt) {
  // The mutation the proof must not survive: the centroid's score alone is the mean row's logit,
  // and the rows above the mean lie above it.
  const Clustered c = make_clusters(32, 640, 1.0f, 11);
  EXPECT_GT(worst_excess(c, {.radius = false, .rounding = true}, 40, 5), 0.0);
}

TEST(FlashHeadBound, ActivationNormBoundIsAnUpperBoundAndTight) {
  const auto x = kestrel::testing::edge_activations(3, 640, 9);
  k::Q8Activations xq;
  k::quantize_q8_activations(x.data(), 3, 640, 640, xq);
  for (size_t t = 0; t < 3; ++t) {
    long double exact = 0;
    for (size_t i = 0; i < 640; ++i) {
      const long double v = static_cast<long double>(xq.scale[t * 20 + i / 32]) * xq.q[t * 640 + i];
      exact += v * v;
    }
    const double bound = h::activation_norm_bound(xq, t);
    EXPECT_GE(static_cast<long double>(bound), std::sqrt(exact));
    EXPECT_LE(static_cast<long double>(bound), std::sqrt(exact) * (1 + 1e-12L));
  }
}

TEST(FlashHeadBound, RadiiAndNormsAreThoseOfTheDequantizedRows) {
  kestrel::ThreadPool pool(2);
  const Clustered c = make_clusters(4, 64, 1.0f, 3);
  const k::Matrix head = kestrel::testing::q8_0_view(c.rows, c.k * c.cap, c.d);
  const k::Matrix cents = kestrel::testing::q8_0_view(c.centroids, c.k, c.d);
  const h::ClusterBounds b = h::compute_cluster_bounds(head, cents, c.cap, pool);
  ASSERT_EQ(b.radius.size(), 4u);
  for (size_t ci = 0; ci < c.k; ++ci) {
    std::vector<float> cv(c.d), w(c.d);
    kestrel::gguf::dequantize(kestrel::gguf::TensorType::kQ8_0, cents.row(ci), cv.data(), c.d);
    double r2 = 0, n2 = 0, c2 = 0;
    for (size_t j = 0; j < c.d; ++j) c2 += static_cast<double>(cv[j]) * cv[j];
    for (size_t r = ci * c.cap; r < (ci + 1) * c.cap; ++r) {
      kestrel::gguf::dequantize(kestrel::gguf::TensorType::kQ8_0, head.row(r), w.data(), c.d);
      double dist = 0, norm = 0;
      for (size_t j = 0; j < c.d; ++j) dist += (w[j] - static_cast<double>(cv[j])) * (w[j] - static_cast<double>(cv[j])), norm += static_cast<double>(w[j]) * w[j];
      r2 = std::max(r2, dist), n2 = std::max(n2, norm);
    }
    EXPECT_GE(b.radius[ci], std::sqrt(r2));
    EXPECT_NEAR(b.radius[ci], std::sqrt(r2), 1e-6 * std::sqrt(r2));
    EXPECT_GE(b.norm[ci], std::sqrt(n2) + std::sqrt(c2));
    EXPECT_NEAR(b.norm[ci], std::sqrt(n2) + std::sqrt(c2), 1e-6 * std::sqrt(n2));
  }
  EXPECT_THROW(h::compute_cluster_bounds(head, cents, 8, pool), kestrel::Error);
}

}  // namespace
