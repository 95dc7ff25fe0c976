// AWQ's per-channel scale search (quant/awq.h) and the folding of its scales
// (image/channel_scaling.h), against float64 references computed here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/image/channel_scaling.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/quant/awq.h"
#include "kestrel/quant/gptq.h"
#include "kestrel/quant/w4.h"

namespace q = kestrel::quant;

namespace {

// Inputs whose channels differ in magnitude as LLM activations do: most near 1, a few
// (every 37th) 30x larger, the pattern AWQ was designed for (Lin et al. 2023, section 2.1).
q::ActivationStats outlier_activations(size_t n, size_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  q::ActivationStats s;
  s.cols = cols;
  s.sample.resize(n * cols);
  s.mean_square.assign(cols, 0.0f);
  s.mean_abs.assign(cols, 0.0f);
  for (size_t t = 0; t < n; ++t) {
    for (size_t i = 0; i < cols; ++i) {
      const float x = dist(rng) * (i % 37 == 5 ? 30.0f : 1.0f);
      s.sample[t * cols + i] = x;
      s.mean_square[i] += x * x / static_cast<float>(n);
      s.mean_abs[i] += std::fabs(x) / static_cast<float>(n);
    }
  }
  return s;
}

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// sum_t sum_r (W x_t - Wq (x_t / s))^2 in float64, Wq dequantized row by row.
double reference_output_error(const std::vector<float>& w, const q::W4Matrix& wq, const q::ActivationStats& st,
                              const std::vector<float>* s) {
  std::vector<float> row(wq.cols);
  double total = 0.0;
  for (size_t r = 0; r < wq.rows; ++r) {
    kestrel::kernels::matrix_row(wq.view(), r, row.data());
    for (size_t t = 0; t < st.n_sample(); ++t) {
      double exact = 0.0, approx = 0.0;
      for (size_t i = 0; i < wq.cols; ++i) {
        const double x = st.sample[t * wq.cols + i];
        exact += static_cast<double>(w[r * wq.cols + i]) * x;
        approx += static_cast<double>(row[i]) * (s ? x / (*s)[i] : x);
      }
      total += (exact - approx) * (exact - approx);
    }
  }
  return total;
}

}  // namespace

TEST(Awq, ScalesLowerTheOutputErrorOfRoundToNearest) {
  kestrel::ThreadPool pool(2);
  const size_t rows = 48, cols = 256, n = 128;
  const auto st = outlier_activations(n, cols, 3);
  const auto w = gaussian(rows * cols, 4);
  const q::DenseView view{w.data(), rows, cols};
  for (bool zero_points : {true, false}) {
    const q::W4Params params{32, zero_points, false};
    const auto r = q::search_awq_scales({&view, 1}, st, st.mean_abs.data(), params, 20, pool);
    ASSERT_EQ(r.scales.size(), cols);
    EXPECT_GT(r.alpha, 0.0f);
    // The search's own bookkeeping agrees with an independent float64 evaluation...
    const auto rtn = q::quantize_w4(w.data(), rows, cols, 32, nullptr, zero_points, pool);
    const double rtn_error = reference_output_error(w, rtn, st, nullptr);
    std::vector<float> scaled = w;
    for (size_t r0 = 0; r0 < rows; ++r0) {
      for (size_t i = 0; i < cols; ++i) scaled[r0 * cols + i] *= r.scales[i];
    }
    const auto awq = q::quantize_w4(scaled.data(), rows, cols, 32, nullptr, zero_points, pool);
    const double awq_error = reference_output_error(w, awq, st, &r.scales);
    // ...and the outlier channels' error, which dominates RTN's, shrinks by a large factor.
    EXPECT_LT(awq_error, 0.6 * rtn_error) << "zero_points " << zero_points;
    // (The W4 kernel may round activations and weights to bf16 for batches: a 2 % margin.)
    EXPECT_NEAR(q::awq_output_error({&view, 1}, st, r.scales.data(), params, pool), awq_error, 2e-2 * awq_error);
    EXPECT_NEAR(q::awq_output_error({&view, 1}, st, nullptr, params, pool), rtn_error, 2e-2 * rtn_error);
  }
}

TEST(Awq, NeverWorseThanNoScaling) {
  // Uniform channels: scaling cannot help much; alpha = 0 is a candidate, so the result is at
  // most the unscaled error.
  kestrel::ThreadPool pool(2);
  const size_t rows = 16, cols = 64, n = 64;
  auto st = outlier_activations(n, cols, 7);
  for (auto& x : st.sample) x = std::clamp(x, -3.0f, 3.0f);
  const auto w = gaussian(rows * cols, 8);
  const q::DenseView view{w.data(), rows, cols};
  const auto r = q::search_awq_scales({&view, 1}, st, st.mean_abs.data(), {}, 5, pool);
  EXPECT_LE(r.error, r.error_unscaled);
}

TEST(Awq, BadShapesAreErrors) {
  kestrel::ThreadPool pool(1);
  const auto st = outlier_activations(8, 64, 1);
  const auto w = gaussian(4 * 32, 2);
  const q::DenseView narrow{w.data(), 4, 32};
  EXPECT_THROW(q::search_awq_scales({&narrow, 1}, st, st.mean_abs.data(), {}, 20, pool), kestrel::Error);
  const q::DenseView ok{w.data(), 2, 64};
  EXPECT_THROW(q::search_awq_scales({&ok, 1}, st, st.mean_abs.data(), {}, 1, pool), kestrel::Error);
  q::ActivationStats empty = st;
  empty.sample.clear();
  EXPECT_THROW(q::search_awq_scales({&ok, 1}, empty, st.mean_abs.data(), {}, 20, pool), kestrel::Error);
  const std::vector<float> bad(64, -1.0f);
  EXPECT_THROW(q::awq_output_error({&ok, 1}, st, bad.data(), {}, pool), kestrel::Error);
}

TEST(ChannelScaling, FoldsAreExactForNormThenMatrixAndUpThenDown) {
  // y = W (x / rms(x) * g) and z = D (a * (U x)) are unchanged when W's columns are multiplied
  // by s and g divided by it, or D's columns by s and U's rows divided by it.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), logs(-2.0f, 2.0f);
  const size_t d = 8, f = 6;
  std::vector<float> x(d), g(d), w(3 * d), up(f * d), down(2 * f), a(f), s(d), t(f);
  for (auto* v : {&x, &g, &w, &up, &down, &a}) for (auto& e : *v) e = u(rng);
  for (auto& e : s) e = std::exp(logs(rng));
  for (auto& e : t) e = std::exp(logs(rng));
  kestrel::image::ChannelScaling sc;
  sc.column_scale["w"] = s;
  sc.vector_divisor["g"] = s;
  sc.column_scale["down"] = t;
  sc.row_divisor["up"] = t;
  auto forward = [&](const std::vector<float>& gw, const std::vector<float>& ww, const std::vector<float>& uw,
                     const std::vector<float>& dw) {
    double ms = 0;
    for (float e : x) ms += static_cast<double>(e) * e;
    const double inv = 1.0 / std::sqrt(ms / d);
    std::vector<double> out;
    for (size_t r = 0; r < 3; ++r) {
      double acc = 0;
      for (size_t i = 0; i < d; ++i) acc += static_cast<double>(ww[r * d + i]) * (x[i] * inv * gw[i]);
      out.push_back(acc);
    }
    for (size_t r = 0; r < 2; ++r) {
      double acc = 0;
      for (size_t j = 0; j < f; ++j) {
        double h = 0;
        for (size_t i = 0; i < d; ++i) h += static_cast<double>(uw[j * d + i]) * x[i];
        acc += static_cast<double>(dw[r * f + j]) * a[j] * h;
      }
      out.push_back(acc);
    }
    return out;
  };
  const auto before = forward(g, w, up, down);
  sc.apply("g", g.data(), 1, d);
  sc.apply("w", w.data(), 3, d);
  sc.apply("up", up.data(), f, d);
  sc.apply("down", down.data(), 2, f);
  sc.apply("other", x.data(), 1, d);  // names without scales are left alone
  const auto after = forward(g, w, up, down);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_NEAR(after[i], before[i], 1e-5 * (1 + std::fabs(before[i])));
  EXPECT_THROW(sc.apply("w", w.data(), 1, d - 1), kestrel::Error);
}

TEST(Gptq, CompensationLowersTheOutputErrorOnCorrelatedInputs) {
  // x = A z with a random mixing A: correlated channels, where spreading a rounding error over
  // the channels not yet rounded pays (Frantar et al. 2022). Compared with the independent
  // per-group fit weighted by E[x_i^2], in a float64 evaluation written here.
  kestrel::ThreadPool pool(2);
  const size_t rows = 32, cols = 128, n = 1024;
  std::mt19937 rng(9);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> a(cols * cols), z(n * cols);
  for (auto& e : a) e = g(rng) / std::sqrt(static_cast<float>(cols));
  for (size_t i = 0; i < cols; ++i) a[i * cols + i] += 1.0f;
  for (auto& e : z) e = g(rng);
  q::ActivationStats st;
  st.cols = cols;
  st.sample.assign(n * cols, 0.0f);
  st.mean_square.assign(cols, 0.0f);
  for (size_t t = 0; t < n; ++t) {
    for (size_t i = 0; i < cols; ++i) {
      float v = 0;
      for (size_t k = 0; k < cols; ++k) v += a[i * cols + k] * z[t * cols + k];
      st.sample[t * cols + i] = v;
      st.mean_square[i] += v * v / static_cast<float>(n);
    }
  }
  const auto w = gaussian(rows * cols, 10);
  const auto weighted = q::quantize_w4(w.data(), rows, cols, 32, st.mean_square.data(), true, pool);
  const auto gptq = q::quantize_w4_gptq(w.data(), rows, cols, 32, st.sample.data(), n, 0.01, pool);
  const double e_weighted = reference_output_error(w, weighted, st, nullptr);
  const double e_gptq = reference_output_error(w, gptq, st, nullptr);
  EXPECT_LT(e_gptq, 0.8 * e_weighted);
  EXPECT_THROW(q::quantize_w4_gptq(w.data(), rows, cols, 48, st.sample.data(), n, 0.01, pool), kestrel::Error);
  EXPECT_THROW(q::quantize_w4_gptq(w.data(), rows, cols, 32, st.sample.data(), 0, 0.01, pool), kestrel::Error);
}
