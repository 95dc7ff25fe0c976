// Activation-aware weight quantization (AWQ; Lin et al. 2023, arXiv 2306.00978): per input
// channel scales, chosen on recorded activations, that make the channels which carry large
// activations coarser-grained in the input and finer-grained in the INT4 weights.
//
// For a group of matrices W_k that read the same input x, AWQ stores Q(W_k diag(s)) and feeds
// them x / s: the product is unchanged in exact arithmetic, but the quantization error of
// column i is divided by s_i in the output. The division of x by s is folded into the operation
// that produces x (an RMSNorm weight, or the rows of the matrix before), so it costs nothing at
// run time (image/channel_scaling.h).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kestrel/base/thread_pool.h"

namespace kestrel::quant {

/// What calibration records about the input x of a layer matrix (runtime/calibration.h).
struct ActivationStats {
  size_t cols = 0;
  std::vector<float> mean_square;  // E[x_i^2], [cols]
  std::vector<float> mean_abs;     // E|x_i|, [cols]
  std::vector<float> sample;       // float32 [n_sample, cols]: input rows seen, a uniform subsample
  size_t n_sample() const { return cols == 0 ? 0 : sample.size() / cols; }
};

/// Per layer matrix (its GGUF name). Matrices that read the same input (attention Q/K/V, FFN
/// gate/up) share one object.
using ActivationStatsMap = std::map<std::string, std::shared_ptr<const ActivationStats>>;

/// How the matrices are quantized (quant/w4.h).
struct W4Params {
  size_t group_size = 32;
  bool zero_points = true;
  /// Weight each group's fit by the (scaled) mean squared input, as imatrix does.
  bool weighted = true;
  /// With zero_points: minimums tied to integer zero points (quantize_w4's integer_zero_points).
  bool integer_zero_points = false;
};

/// A float32 matrix [rows, cols], row-major (a row holds one output's input weights).
struct DenseView {
  const float* w = nullptr;
  size_t rows = 0;
  size_t cols = 0;
};

struct AwqSearchResult {
  std::vector<float> scales;  // s [cols]: columns are multiplied by s_i, the input divided by it
  float alpha = 0.0f;         // the exponent chosen: s_i proportional to magnitude_i^alpha
  double error_unscaled = 0;  // output error without scaling (alpha = 0)
  double error = 0;           // output error with `scales`
};

/// AWQ's grid search. For alpha = 0, 1/(grid_points - 1), ..., 1: s_i = m_i^alpha, normalized
/// so that max(s) * min(s) = 1 (m: `magnitude`, e.g. E|x_i|, floored at 1e-5 of its maximum);
/// each candidate quantizes every matrix as W diag(s) and scores the output error on the
/// recorded sample (awq_output_error). Returns the best candidate; alpha = 0 (no scaling) is
/// among them, so the error never exceeds the unscaled one. The search quantizes with
/// quantize_w4's `fast` grids; the final quantization is the caller's.
/// Throws kestrel::Error when shapes disagree (every matrix must have stats.cols columns and
/// `magnitude` stats.cols values), the sample is empty, or grid_points < 2.
AwqSearchResult search_awq_scales(std::span<const DenseView> matrices, const ActivationStats& stats,
                                  const float* magnitude, const W4Params& params, size_t grid_points,
                                  ThreadPool& pool);

/// Output error of INT4 quantization with input scaling s (null: none) on the recorded sample X
/// [n, cols]: sum over the matrices, sample rows and outputs of (W x - Q(W diag(s)) (x / s))^2,
/// the weights of the quantizer's fit being E[x_i^2] / s_i^2 when params.weighted.
/// Throws kestrel::Error as search_awq_scales.
double awq_output_error(std::span<const DenseView> matrices, const ActivationStats& stats,
                        const float* s, const W4Params& params, ThreadPool& pool, bool fast = false);

}  // namespace kestrel::quant
