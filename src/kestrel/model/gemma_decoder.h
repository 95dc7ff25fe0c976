// The Gemma decoder: one forward pass for every configuration GemmaConfig describes — Gemma 3
// (sliding / global layers in a 5:1 pattern, 1/sqrt(head_dim) query scale) and Gemma 4 E2B /
// E4B (per-layer head sizes and RoPE, "proportional" RoPE on full layers, KV sharing, V norm,
// per-layer embeddings, layer output scales, double-wide MLPs). Sources: HF transformers
// models/gemma3/modeling_gemma3.py and models/gemma4/modeling_gemma4.py (5.24); llama.cpp
// src/models/gemma3.cpp and gemma4.cpp. docs/gemma4.md describes the Gemma 4 pass step by step.
//
// One layer, for the rows of a chunk (tokens of one or several sequences):
//   h += rms(Wo · attention(rope(rms_head(Wq a)) · s, cache)) · w_post_attn,  a = rms(h) · w_in
//   h += rms(down(gelu_tanh(gate(b)) · up(b))) · w_post_ffn,                  b = rms(h) · w_ffn
//   h += rms(W_proj (gelu(W_gate h) · pl_i)) · w_post_norm                    (with per-layer inputs)
//   h *= layer_output_scale                                                   (when the file has one)
// where K = rope(rms_head(Wk a)), V = Wv a (rms_head without weight on Gemma 4; K when a layer
// has no attn_v) go to the layer's cache, or, on a KV-shared layer, nothing is computed and the
// queries read the source layer's cache.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/head/output_head.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/model/gemma_config.h"
#include "kestrel/model/model.h"
#include "kestrel/model/ple.h"
#include "kestrel/model/weights.h"

namespace kestrel::model {

class GemmaDecoder final : public Model {
 public:
  /// Reads the configuration from `file`'s metadata (GemmaConfig::from_gguf) and the weights
  /// through a WeightStore (options.precision, `pool` to quantize). Throws kestrel::Error for
  /// missing or misshapen tensors.
  GemmaDecoder(const gguf::File& file, const LoadOptions& options, ThreadPool& pool);

  const ModelInfo& info() const override { return info_; }
  /// KV-shared layers get an empty LayerCache (capacity 0): they read their source's.
  KvCache new_cache(size_t n_ctx) const override;
  void forward_hidden(std::span<const TokenId> tokens, KvCache& cache, Logits which, float* hidden,
                      ThreadPool& pool, ActivationObserver* observer = nullptr) const override;
  void forward_batch(std::span<const BatchSequence> seqs, ThreadPool& pool) const override;
  size_t max_batch_tokens() const override { return kMaxUbatch; }
  BatchExactness batch_exactness() const override { return batch_exactness_; }
  const head::OutputHead& output_head() const override { return head_; }
  const GemmaConfig& config() const { return config_; }
  /// out = E[token] * sqrt(d_model), float32 [d_model]: the input row of `token` (through the
  /// head's token -> row map when the embedding is the tied head), as HF's
  /// Gemma4TextScaledWordEmbedding gives it; Gemma 4's MTP assistant reads it. Throws
  /// kestrel::Error for an id outside the vocabulary.
  void token_embedding(TokenId token, float* out) const;

  /// Tokens per forward chunk; sliding-layer caches hold window + kMaxUbatch - 1 slots.
  static constexpr size_t kMaxUbatch = 256;

 private:
  /// Weights of one layer (GGUF names blk.<il>.*).
  struct Layer {
    const float* attn_norm = nullptr;       // [d_model]
    kernels::Matrix wq, wk, wv, wo;         // wk, wv empty on KV-shared layers; wv empty when V = K
    const float* q_norm = nullptr;          // [head_dim]
    const float* k_norm = nullptr;          // [head_dim]; null on KV-shared layers
    const float* post_attn_norm = nullptr;  // [d_model]
    const float* ffn_norm = nullptr;        // [d_model]
    kernels::Matrix gate, up, down;         // [d_ff, d_model], [d_ff, d_model], [d_model, d_ff]
    const float* post_ffn_norm = nullptr;   // [d_model]
    kernels::Matrix ple_gate, ple_proj;     // [ple_dim, d_model], [d_model, ple_dim]; with PLE only
    const float* ple_post_norm = nullptr;   // [d_model]
    float out_scale = 1.0f;                 // layer_output_scale
    std::vector<float> inv_freq;            // RoPE inverse frequencies [rope.n_rot / 2]
    size_t rope_table = 0;                  // its (inv_freq, position scale) among rope_tables_
  };

  /// A distinct RoPE setting (layers of one kind share one: Gemma 3's local and global layers):
  /// the rows' (cos, sin) are computed once per chunk for each, not once per layer.
  struct RopeTable {
    std::vector<float> inv_freq;  // [n_rot / 2]
    double position_scale = 1.0;
  };

  /// One segment of a chunk: rows [first, first + n) are one sequence's tokens at positions
  /// pos0 .. pos0 + n - 1 of `cache` (pos0 = cache->n_past when the chunk starts).
  struct Segment {
    size_t first = 0;
    size_t n = 0;
    size_t pos0 = 0;
    KvCache* cache = nullptr;
    float* hidden = nullptr;  // final hidden states per `which` (kAll: n rows, kLast: the last), or null
    bool all_rows = false;    // n rows whatever `which` says (BatchSequence::all_rows)
  };

  /// Activations of one chunk, float32 row-major with one row per token, in one arena (the
  /// calling thread's, kept between chunks) sized for the chunk's rows and the widest layer and
  /// reused by every layer. Each array starts on a 64-byte boundary; contents start undefined.
  class Scratch {
   public:
    Scratch(const GemmaConfig& c, size_t n, size_t n_rope_tables);
    float* x = nullptr;         // [n, d_model] the residual stream
    float* xn = nullptr;        // [n, d_model] normed input of a block, then its output
    float* q = nullptr;         // [n, n_heads * head_dim]
    float* attn = nullptr;      // [n, n_heads * head_dim]
    float* k = nullptr;         // [n, n_kv_heads * head_dim]
    float* v = nullptr;         // [n, n_kv_heads * head_dim]
    float* cos_sin = nullptr;   // [n_rope_tables, n, n_rot] each row's (cos, sin) per RoPE table
    float* gate = nullptr;      // [n, d_ff]
    float* up = nullptr;        // [n, d_ff]
    float* pl = nullptr;        // [n, n_layers * ple_dim] per-layer inputs
    float* ple_gate = nullptr;  // [n, ple_dim]
  };

  /// Throws kestrel::Error when forward_hidden(tokens, cache) could not run: no tokens, a cache
  /// of another model, a context overflow or an id outside the vocabulary.
  void check(std::span<const TokenId> tokens, const KvCache& cache) const;
  /// One pass over `tokens` (at most kMaxUbatch), the rows of `segs` (validated); appends each
  /// segment's tokens to its cache and writes its hidden states.
  void forward_chunk(std::span<const TokenId> tokens, std::span<const Segment> segs, Logits which,
                     ThreadPool& pool, ActivationObserver* observer) const;
  /// x += the attention block of layer il over the chunk's n rows; each segment's keys and
  /// values go to, and its queries read, its own cache (the source layer's on KV-shared layers).
  void attention_block(size_t il, size_t n, std::span<const Segment> segs, Scratch& s,
                       ThreadPool& pool, ActivationObserver* observer) const;
  /// x += the GeGLU MLP block of layer il over n rows.
  void mlp_block(size_t il, size_t n, Scratch& s, ThreadPool& pool, ActivationObserver* observer) const;
  /// x += the per-layer-input block of layer il over n rows (pl: the chunk's per-layer inputs).
  void ple_block(size_t il, size_t n, Scratch& s, ThreadPool& pool, ActivationObserver* observer) const;

  GemmaConfig config_;
  ModelInfo info_;
  WeightStore store_;
  BatchExactness batch_exactness_ = BatchExactness::kShortApart;
  KvTypes kv_types_;  // of the caches new_cache allocates
  kernels::Matrix embedding_;  // [n_vocab, d_model], also the output head when tied
  bool tied_ = true;
  head::OutputHead head_;
  const float* output_norm_ = nullptr;
  PerLayerInputs ple_;
  std::vector<Layer> layers_;
  std::vector<RopeTable> rope_tables_;
  /// Floats per row of a Scratch's cos_sin table: the widest layer's n_rot (as Scratch sizes it).
  size_t rope_stride() const {
    size_t n_rot = 0;
    for (const GemmaLayerConfig& l : config_.layers) n_rot = std::max(n_rot, l.rope.n_rot);
    return n_rot;
  }
};

}  // namespace kestrel::model
