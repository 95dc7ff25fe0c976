// Gemma 3 text decoder (HF transformers models/gemma3/modeling_gemma3.py; llama.cpp
// src/models/gemma3.cpp). The 270M model: 18 layers, d_model 640, 4 query heads over 1 KV
// head of head_dim 256, GeGLU MLP of 2048, 262,144-token tied embedding.
#pragma once

#include <vector>

#include "kestrel/formats/gguf.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/model/gemma_common.h"
#include "kestrel/model/model.h"
#include "kestrel/model/weights.h"

namespace kestrel::model {

/// Hyperparameters, all read from GGUF metadata `gemma3.*`. Two are absent from the files
/// llama.cpp writes, and take llama.cpp's gemma3 values when missing (src/llama-model.cpp):
/// the sliding-window layer period (`gemma3.attention.sliding_window_pattern`, default 6: layer
/// i is global when (i + 1) % 6 == 0) and the sliding layers' RoPE base
/// (`gemma3.rope.freq_base_swa`, default 10,000; HF config rope_local_base_freq).
struct Gemma3Config {
  size_t n_layers = 0;
  size_t d_model = 0;
  size_t d_ff = 0;
  size_t n_heads = 0;
  size_t n_kv_heads = 0;
  size_t head_dim = 0;
  size_t n_vocab = 0;
  size_t context_length = 0;
  size_t sliding_window = 0;
  size_t sliding_window_pattern = 6;
  float rms_eps = 1e-6f;
  float rope_base_global = 1e6f;
  float rope_base_sliding = 1e4f;
  float rope_scale_global = 1.0f;  // linear position scaling (1/factor) on global layers
  float attention_scale = 0.0f;    // query_pre_attn_scalar^-0.5 = 1/sqrt(head_dim)
  float final_softcap = 0.0f;      // 0 = none
  float embed_scale = 0.0f;        // sqrt(d_model)

  bool is_sliding(size_t layer) const { return (layer + 1) % sliding_window_pattern != 0; }
  /// Throws kestrel::Error when a key is missing or a value is inconsistent.
  static Gemma3Config from_gguf(const gguf::File& file);
};

class Gemma3Model final : public Model {
 public:
  Gemma3Model(const gguf::File& file, const LoadOptions& options, ThreadPool& pool);

  const ModelInfo& info() const override { return info_; }
  KvCache new_cache(size_t n_ctx) const override;
  void forward_hidden(std::span<const TokenId> tokens, KvCache& cache, Logits which, float* hidden,
                      ThreadPool& pool, ActivationObserver* observer = nullptr) const override;
  void forward_batch(std::span<const BatchSequence> seqs, ThreadPool& pool) const override;
  size_t max_batch_tokens() const override { return kMaxUbatch; }
  const head::OutputHead& output_head() const override { return head_; }
  const Gemma3Config& config() const { return config_; }

  /// Tokens per forward chunk; sliding-layer caches hold window + kMaxUbatch - 1 slots.
  static constexpr size_t kMaxUbatch = 256;

 private:
  struct Layer {
    const float* attn_norm;
    kernels::Matrix wq, wk, wv, wo;
    const float* q_norm;
    const float* k_norm;
    const float* post_attn_norm;
    gemma::GegluMlp mlp;
  };

  /// One pass over `tokens` (at most kMaxUbatch), the rows of `segs` (validated).
  void forward_chunk(std::span<const TokenId> tokens, std::span<const gemma::Segment> segs,
                     Logits which, ThreadPool& pool, ActivationObserver* observer) const;
  /// x += the attention block of layer il for the n rows of x ([n, d_model] float32); each
  /// segment's keys and values go to, and its queries read, its own cache.
  void attention_block(const Layer& layer, size_t il, size_t n, std::span<const gemma::Segment> segs,
                       std::vector<float>& x, ThreadPool& pool, ActivationObserver* observer) const;

  Gemma3Config config_;
  ModelInfo info_;
  WeightStore store_;
  kernels::Matrix embedding_;  // [n_vocab, d_model], also the output head when tied
  bool tied_ = true;
  head::OutputHead head_;
  const float* output_norm_ = nullptr;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_global_, inv_freq_sliding_;
};

}  // namespace kestrel::model
