// AWQ's per-channel scaling applied to a checkpoint's tensors (quant/awq.h has the search).
//
// A scaling group is a set of layer matrices that read one input x, and the operation that
// produces x, into which the division by s is folded:
//   - attention Q/K/V read attn_norm's output: attn_norm.weight /= s;
//   - FFN gate/up read ffn_norm's output:      ffn_norm.weight /= s;
//   - FFN down reads gelu(gate) * up:           the rows of ffn_up /= s.
//   - Gemma 3 only: the attention output projection reads softmax(QK^T) V per head, linear in
//     V: the rows of attn_v /= s (one scale per KV-head channel, shared by the query heads of
//     that KV head). Gemma 4 normalizes V (an RMS norm without weight) before attention, which
//     a scale of V's rows would not survive, so there the output projection is not scaled.
// Gemma's GGUF norm weights hold the whole multiplier (llama.cpp's converter adds the 1 of
// HF's (1 + w)), and kernels::rms_norm computes x / rms(x) * weight, so dividing the weight is
// exact.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/quant/awq.h"

namespace kestrel::image {

/// Per-channel scales folded into a checkpoint's tensors (GGUF names).
struct ChannelScaling {
  std::map<std::string, std::vector<float>> column_scale;   // matrix [rows, cols]: W[r][i] *= s_i
  std::map<std::string, std::vector<float>> row_divisor;    // matrix: W[r][i] /= s_r
  std::map<std::string, std::vector<float>> vector_divisor; // 1-D tensor: v_i /= s_i

  bool empty() const { return column_scale.empty() && row_divisor.empty() && vector_divisor.empty(); }
  /// Applies what applies to the tensor `name`, float32 [rows, cols] (a vector: rows = 1).
  /// Throws kestrel::Error when a scale vector's length does not match the tensor.
  void apply(const std::string& name, float* data, size_t rows, size_t cols) const;
};

/// One scaling group (see the top of this file).
struct ScalingGroup {
  std::vector<std::string> matrices;  // read the same input
  std::string fold_vector;            // the norm weight divided by s, or empty
  std::string fold_rows;              // the matrix whose rows are divided by s, or empty
  /// Attention output groups: the input is heads of head_dim channels, query head h reading
  /// KV head h / heads_per_kv, whose channels are fold_rows' rows. 0: rows = columns.
  size_t heads_per_kv = 0;
  size_t head_dim = 0;
};

/// The scales of fold_rows' rows for column scales `s` (s itself unless heads_per_kv > 0).
std::vector<float> fold_row_scales(const ScalingGroup& group, const std::vector<float>& s);

/// The groups of a Gemma 3 or Gemma 4 checkpoint, per layer, listing only tensors that exist
/// (Gemma 4's KV-sharing layers may lack K/V). Other architectures: none.
std::vector<ScalingGroup> scaling_groups(const gguf::File& file);

/// Runs AWQ's search (quant::search_awq_scales with s ~ E|x|^alpha) for every group whose
/// first matrix has calibration statistics with a row sample, dequantizing the group's
/// matrices from `file`, and returns the scales as a ChannelScaling. `is_int4` (optional;
/// default: every matrix) says which matrices the image stores as INT4: only those are
/// quantized and scored by the search, a group without any is left unscaled, and the scales
/// found still apply to every matrix of the group (the caller writes the others, e.g. Q8_0 or
/// BF16, from the scaled weights, so the fold stays exact). `progress` (optional) gets (group
/// done, groups, the group's first INT4 matrix, the search's result).
ChannelScaling search_channel_scaling(
    const gguf::File& file, const quant::ActivationStatsMap& stats, const quant::W4Params& params,
    size_t grid_points, ThreadPool& pool,
    const std::function<void(size_t, size_t, const std::string&, const quant::AwqSearchResult&)>& progress = {},
    const std::function<bool(const std::string&)>& is_int4 = {});

}  // namespace kestrel::image
