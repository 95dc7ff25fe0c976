// Gemma 4 text decoder, the E2B / E4B family (and NVIDIA Nemotron 3.5 Bolt E4B, which keeps
// the E4B architecture). Sources: HF transformers models/gemma4/modeling_gemma4.py and
// configuration_gemma4.py (5.24); llama.cpp src/models/gemma4.cpp and the Gemma4Model class of
// its HF converter. docs/gemma4.md describes the forward pass step by step.
//
// What differs from Gemma 3: norms multiply by w (no 1 +), V is RMS-normed without a weight,
// attention scale 1, sliding and full layers differ in head size and RoPE (full layers:
// "proportional" RoPE over part of the head, llama.cpp's rope_freqs factors), the last
// `shared_kv_layers` layers reuse the cache of the last earlier layer of the same type, the
// MLP width may vary per layer (E2B's double-wide shared layers), per-layer embeddings are
// added through a gate after each block, each layer ends by scaling the residual stream by a
// trained scalar, and the logits are soft-capped (30).
#pragma once

#include <vector>

#include "kestrel/formats/gguf.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/model/gemma_common.h"
#include "kestrel/model/model.h"
#include "kestrel/model/ple.h"
#include "kestrel/model/weights.h"

namespace kestrel::model {

/// Hyperparameters, read from GGUF metadata `gemma4.*` as llama.cpp's converter writes them.
/// feed_forward_length and attention.head_count_kv may be scalars or per-layer arrays;
/// attention.sliding_window_pattern is a bool array (true = sliding).
struct Gemma4Config {
  size_t n_layers = 0;
  size_t d_model = 0;
  size_t n_heads = 0;
  size_t n_vocab = 0;
  size_t context_length = 0;
  size_t sliding_window = 0;
  size_t head_dim_full = 0;     // attention.key_length
  size_t head_dim_sliding = 0;  // attention.key_length_swa
  size_t n_rot_full = 0;        // rope.dimension_count
  size_t n_rot_sliding = 0;     // rope.dimension_count_swa
  size_t n_kv_shared = 0;       // attention.shared_kv_layers
  size_t ple_dim = 0;           // embedding_length_per_layer_input; 0 = no per-layer inputs
  std::vector<size_t> d_ff;        // per layer
  std::vector<size_t> n_kv_heads;  // per layer
  std::vector<bool> sliding;       // per layer
  float rms_eps = 1e-6f;
  float rope_base_full = 1e6f;
  float rope_base_sliding = 1e4f;
  float final_softcap = 0.0f;
  float embed_scale = 0.0f;  // sqrt(d_model)

  bool is_sliding(size_t layer) const { return sliding[layer]; }
  size_t head_dim(size_t layer) const { return sliding[layer] ? head_dim_sliding : head_dim_full; }
  size_t first_shared() const { return n_layers - n_kv_shared; }
  /// The layer whose cache `layer` attends to: itself, or for a KV-shared layer the last
  /// layer before first_shared() of the same type.
  size_t kv_source(size_t layer) const;
  /// Throws kestrel::Error when a key is missing or a value is inconsistent.
  static Gemma4Config from_gguf(const gguf::File& file);
};

class Gemma4Model final : public Model {
 public:
  Gemma4Model(const gguf::File& file, const LoadOptions& options, ThreadPool& pool);

  const ModelInfo& info() const override { return info_; }
  /// KV-shared layers get an empty LayerCache (capacity 0): they read their source's.
  KvCache new_cache(size_t n_ctx) const override;
  void forward_hidden(std::span<const TokenId> tokens, KvCache& cache, Logits which, float* hidden,
                      ThreadPool& pool, ActivationObserver* observer = nullptr) const override;
  void forward_batch(std::span<const BatchSequence> seqs, ThreadPool& pool) const override;
  size_t max_batch_tokens() const override { return kMaxUbatch; }
  const head::OutputHead& output_head() const override { return head_; }
  const Gemma4Config& config() const { return config_; }

  /// Tokens per forward chunk; sliding-layer caches hold window + kMaxUbatch - 1 slots.
  static constexpr size_t kMaxUbatch = 256;

 private:
  struct Layer {
    const float* attn_norm;
    kernels::Matrix wq, wk, wv, wo;  // wk, wv empty on KV-shared layers; wv empty when V = K
    const float* q_norm;
    const float* k_norm;
    const float* post_attn_norm;
    gemma::GegluMlp mlp;
    kernels::Matrix ple_gate, ple_proj;  // [ple_dim, d_model], [d_model, ple_dim]
    const float* ple_post_norm;
    float out_scale;
  };

  /// Throws kestrel::Error when forward_hidden(tokens, cache) could not run (check_forward, and
  /// per-layer cache strides of another model).
  void check(std::span<const TokenId> tokens, const KvCache& cache) const;
  /// One pass over `tokens` (at most kMaxUbatch), the rows of `segs` (validated).
  void forward_chunk(std::span<const TokenId> tokens, std::span<const gemma::Segment> segs,
                     Logits which, ThreadPool& pool, ActivationObserver* observer) const;
  /// x += the attention block of layer il for the n rows of x ([n, d_model] float32); each
  /// segment's keys and values go to, and its queries read, its own cache (the source layer's
  /// on KV-shared layers).
  void attention_block(const Layer& layer, size_t il, size_t n, std::span<const gemma::Segment> segs,
                       std::vector<float>& x, ThreadPool& pool, ActivationObserver* observer) const;
  void ple_block(const Layer& layer, size_t il, size_t n, const float* pl, std::vector<float>& x,
                 ThreadPool& pool, ActivationObserver* observer) const;

  Gemma4Config config_;
  ModelInfo info_;
  WeightStore store_;
  kernels::Matrix embedding_;  // [n_vocab, d_model], also the output head when tied
  bool tied_ = true;
  head::OutputHead head_;
  const float* output_norm_ = nullptr;
  PerLayerInputs ple_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_full_, inv_freq_sliding_;
};

}  // namespace kestrel::model
