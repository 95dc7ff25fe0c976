#include "kestrel/quant/awq.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/quant/w4.h"

namespace kestrel::quant {
namespace {

void check_shapes(std::span<const DenseView> matrices, const ActivationStats& stats) {
  if (stats.cols == 0 || stats.n_sample() == 0 || stats.sample.size() % stats.cols != 0) {
    throw Error("AWQ: the calibration recorded no input rows for this matrix");
  }
  if (stats.mean_square.size() != stats.cols) throw Error("AWQ: mean squares do not match the input width");
  for (const auto& m : matrices) {
    if (m.w == nullptr || m.cols != stats.cols || m.rows == 0) {
      throw Error("AWQ: a matrix of " + std::to_string(m.cols) + " columns does not read inputs of " +
                  std::to_string(stats.cols));
    }
  }
}

// The sample's reference outputs W x, and the scaled quantization's error against them.
class Evaluator {
 public:
  Evaluator(std::span<const DenseView> matrices, const ActivationStats& stats, const W4Params& params,
            ThreadPool& pool)
      : matrices_(matrices), stats_(stats), params_(params), pool_(pool) {
    check_shapes(matrices, stats);
    const size_t n = stats.n_sample();
    for (const auto& m : matrices) {
      kernels::Matrix dense;
      dense.type = kernels::WeightType::kF32;
      dense.data = m.w;
      dense.rows = m.rows;
      dense.cols = m.cols;
      auto& y = reference_.emplace_back(n * m.rows);
      kernels::matmul(dense, stats.sample.data(), n, m.cols, y.data(), m.rows, pool);
    }
  }

  double error(const float* s, bool fast) const {
    const size_t n = stats_.n_sample(), cols = stats_.cols;
    std::vector<float> x = stats_.sample;
    std::vector<float> importance = stats_.mean_square;
    if (s != nullptr) {
      for (size_t t = 0; t < n; ++t) {
        for (size_t i = 0; i < cols; ++i) x[t * cols + i] /= s[i];
      }
      for (size_t i = 0; i < cols; ++i) importance[i] /= s[i] * s[i];
    }
    double total = 0.0;
    std::vector<float> scaled, y;
    for (size_t k = 0; k < matrices_.size(); ++k) {
      const DenseView& m = matrices_[k];
      const float* w = m.w;
      if (s != nullptr) {
        scaled.resize(m.rows * cols);
        for (size_t r = 0; r < m.rows; ++r) {
          for (size_t i = 0; i < cols; ++i) scaled[r * cols + i] = m.w[r * cols + i] * s[i];
        }
        w = scaled.data();
      }
      const W4Matrix q = quantize_w4(w, m.rows, cols, params_.group_size,
                                     params_.weighted ? importance.data() : nullptr,
                                     params_.zero_points, pool_, fast, params_.integer_zero_points);
      y.resize(n * m.rows);
      kernels::matmul(q.view(), x.data(), n, cols, y.data(), m.rows, pool_);
      for (size_t j = 0; j < y.size(); ++j) {
        const double e = static_cast<double>(y[j]) - reference_[k][j];
        total += e * e;
      }
    }
    return total;
  }

 private:
  std::span<const DenseView> matrices_;
  const ActivationStats& stats_;
  W4Params params_;
  ThreadPool& pool_;
  std::vector<std::vector<float>> reference_;
};

}  // namespace

AwqSearchResult search_awq_scales(std::span<const DenseView> matrices, const ActivationStats& stats,
                                  const float* magnitude, const W4Params& params, size_t grid_points,
                                  ThreadPool& pool) {
  if (grid_points < 2) throw Error("AWQ: the alpha grid needs at least 2 points");
  if (magnitude == nullptr) throw Error("AWQ: no channel magnitudes");
  const Evaluator eval(matrices, stats, params, pool);
  const size_t cols = stats.cols;
  float top = 0.0f;
  for (size_t i = 0; i < cols; ++i) {
    if (!std::isfinite(magnitude[i]) || magnitude[i] < 0.0f) throw Error("AWQ: a channel magnitude is negative or not finite");
    top = std::max(top, magnitude[i]);
  }
  const float floor = top > 0.0f ? top * 1e-5f : 1.0f;
  AwqSearchResult best;
  best.scales.assign(cols, 1.0f);
  best.error_unscaled = eval.error(nullptr, true);
  best.error = best.error_unscaled;
  std::vector<float> s(cols);
  for (size_t g = 1; g < grid_points; ++g) {
    const float alpha = static_cast<float>(g) / static_cast<float>(grid_points - 1);
    float lo = INFINITY, hi = 0.0f;
    for (size_t i = 0; i < cols; ++i) {
      s[i] = std::pow(std::max(magnitude[i], floor), alpha);
      lo = std::min(lo, s[i]);
      hi = std::max(hi, s[i]);
    }
    const float norm = 1.0f / std::sqrt(lo * hi);
    for (float& v : s) v *= norm;
    const double err = eval.error(s.data(), true);
    if (err < best.error) {
      best.error = err;
      best.alpha = alpha;
      best.scales = s;
    }
  }
  return best;
}

double awq_output_error(std::span<const DenseView> matrices, const ActivationStats& stats,
                        const float* s, const W4Params& params, ThreadPool& pool, bool fast) {
  if (s != nullptr) {
    for (size_t i = 0; i < stats.cols; ++i) {
      if (!(s[i] > 0.0f) || !std::isfinite(s[i])) throw Error("AWQ: scales must be positive and finite");
    }
  }
  return Evaluator(matrices, stats, params, pool).error(s, fast);
}

}  // namespace kestrel::quant
