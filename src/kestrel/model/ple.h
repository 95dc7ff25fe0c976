// Gemma 4 per-layer embeddings (PLE): the per-token inputs that every decoder layer adds
// through its gate (HF modeling_gemma4.py get_per_layer_inputs / project_per_layer_inputs;
// llama.cpp src/models/gemma4.cpp build_inp_per_layer / project_per_layer_inputs).
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/model/model.h"
#include "kestrel/model/weights.h"

namespace kestrel::model {

/// The packed per-layer token table `per_layer_token_embd.weight` ([n_vocab, n_layers * dim],
/// GGUF {n_layers * dim, n_vocab}) read in place from the mapping: a row is dequantized only
/// when a token asks for it, so the table (2.7 G values for E4B) stays on disk until touched.
/// Any type Kestrel reads (F32, F16, BF16, Q8_0, K-quants, ...) and a Kestrel image's INT4 form
/// are accepted.
class PerLayerTable {
 public:
  PerLayerTable() = default;
  /// Throws kestrel::Error when the tensor is missing, misshapen or of an unreadable type.
  PerLayerTable(const gguf::File& file, WeightStore& store, size_t n_vocab, size_t row_len);
  /// Row `token` as float32 [row_len] into `out`.
  void row(size_t token, float* out) const;
  size_t row_len() const { return row_len_; }

 private:
  const gguf::File* file_ = nullptr;
  const gguf::TensorInfo* info_ = nullptr;  // null when the image holds it as INT4
  kernels::Matrix int4_;
  size_t row_len_ = 0;
  uint64_t row_bytes_ = 0;
};

/// Weights of the PLE input path.
struct PerLayerInputs {
  PerLayerTable table;                   // E_pl
  kernels::Matrix model_proj;            // [n_layers * dim, d_model]
  const float* proj_norm = nullptr;      // [dim]
  size_t n_layers = 0;
  size_t dim = 0;                        // hidden_size_per_layer_input
  size_t d_model = 0;
  float eps = 1e-6f;

  /// pl[t, i, :] = (rms(x0[t] W_proj^T / sqrt(d_model))_i * w_norm + E_pl[token_t]_i * sqrt(dim))
  /// / sqrt(2), for layer i < n_layers.
  ///   x0: the scaled input embeddings float32 [n, d_model];
  ///   out: float32 [n, n_layers * dim].
  void compute(std::span<const TokenId> tokens, const float* x0, float* out, ThreadPool& pool,
               ActivationObserver* observer) const;
};

}  // namespace kestrel::model
