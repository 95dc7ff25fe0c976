// The configuration of a Gemma decoder (Gemma 3, Gemma 4 E2B / E4B) as data: the few facts
// that hold for the whole model, and one GemmaLayerConfig per layer for everything that may
// change from layer to layer (attention type and window, head size, KV heads, KV sharing, MLP
// width, RoPE). GemmaDecoder (gemma_decoder.h) runs any such configuration; each family is a
// reader of its GGUF metadata (`gemma3.*`, `gemma4.*`, as llama.cpp's converter writes them)
// into it. The idea follows gemma.cpp's ModelConfig / LayerConfig and llama.cpp's per-layer
// hparams arrays (docs/architecture.md, "The model layer").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kestrel/formats/gguf.h"

namespace kestrel::model {

/// Rotary position embedding of one layer (NeoX "rotate half" over the first n_rot elements of
/// each head; RoFormer, Su et al. 2021). Inverse frequencies inv_freq[i] = base^(-2i / n_rot)
/// for i < n_rot / 2, divided by the file's `rope_freqs` factors when `freq_factors` is set.
struct RopeConfig {
  double base = 1e4;            // θ
  size_t n_rot = 0;             // rotated elements per head: even, 1..head_dim
  float position_scale = 1.0f;  // positions are multiplied by it (linear scaling: 1 / factor)
  /// Divide by llama.cpp's `rope_freqs.weight` [n_rot / 2] when the file has it: Gemma 4's
  /// "proportional" RoPE on full layers (factor 1 for the rotated pairs, 1e30 for the rest).
  bool freq_factors = false;
};

/// What one decoder layer does. Sizes are in elements.
struct GemmaLayerConfig {
  bool sliding = false;     // sliding-window attention (else global / "full")
  size_t window = 0;        // W: a query at position p sees p-W+1 .. p; 0 on global layers
  size_t head_dim = 0;      // of queries, keys and values alike
  size_t n_kv_heads = 0;    // divides GemmaConfig::n_heads
  size_t d_ff = 0;          // GeGLU MLP width
  /// The layer whose KV cache this layer's queries read: itself, or for a Gemma 4 KV-shared
  /// layer an earlier layer of the same type (the shared layer computes no K / V).
  size_t kv_source = 0;
  RopeConfig rope;
  /// Multiplies the queries after RoPE: 1/sqrt(head_dim) for Gemma 3 (llama.cpp
  /// f_attention_scale, HF query_pre_attn_scalar^-0.5), 1 for Gemma 4 (its q/k norms take the
  /// place of the scale; HF Gemma4TextAttention.scaling = 1).
  float query_scale = 1.0f;
};

/// A Gemma decoder's configuration. Norm weights are used as stored in the file (Gemma 3's GGUF
/// holds 1 + w, Gemma 4's w), so the family does not show in the norms.
struct GemmaConfig {
  std::string architecture;    // general.architecture: "gemma3" or "gemma4"
  size_t d_model = 0;
  size_t n_heads = 0;          // query heads, the same on every layer
  size_t n_vocab = 0;          // the token embedding's rows (set by the decoder from the tensor)
  size_t context_length = 0;   // the training context, the largest KvCache n_ctx
  size_t ple_dim = 0;          // per-layer embedding width (Gemma 4 PLE); 0 = none
  bool v_norm = false;         // RMS-norm V per head without a weight (Gemma 4)
  bool v_optional = false;     // a layer without attn_v uses K as V (Gemma 4, HF attention_k_eq_v)
  float rms_eps = 1e-6f;
  float embed_scale = 0.0f;    // the token embedding is multiplied by sqrt(d_model)
  float final_softcap = 0.0f;  // logits -> c * tanh(logits / c) in the head; 0 = none
  std::vector<GemmaLayerConfig> layers;

  size_t n_layers() const { return layers.size(); }
  bool owns_kv(size_t layer) const { return layers[layer].kv_source == layer; }

  /// The configuration that `file`'s metadata describes, for general.architecture gemma3 or
  /// gemma4 (n_vocab left 0). Throws kestrel::Error for another architecture, a missing key or
  /// inconsistent values.
  static GemmaConfig from_gguf(const gguf::File& file);
  /// Gemma 3 from `gemma3.*`. Two keys are absent from the files llama.cpp writes and take
  /// llama.cpp's gemma3 values when missing (src/llama-model.cpp): the sliding-window layer
  /// period (`attention.sliding_window_pattern`, default 6: layer i is global when (i + 1) % 6
  /// == 0) and the sliding layers' RoPE base (`rope.freq_base_swa`, default 10,000; HF
  /// rope_local_base_freq). `rope.scaling.type` linear scales the global layers' positions.
  static GemmaConfig gemma3_from_gguf(const gguf::File& file);
  /// Gemma 4 from `gemma4.*`: feed_forward_length and attention.head_count_kv may be scalars or
  /// per-layer arrays; attention.sliding_window_pattern is one bool per layer (true = sliding);
  /// sliding and full layers have their own head size (key_length_swa / key_length) and RoPE;
  /// the last attention.shared_kv_layers layers read the cache of the last earlier layer of
  /// their type (HF Gemma4TextConfig, kv_sharing).
  static GemmaConfig gemma4_from_gguf(const gguf::File& file);
  /// Throws kestrel::Error unless every layer is runnable: sizes positive, n_heads a multiple of
  /// n_kv_heads, n_rot even and at most head_dim, RoPE base above 1, kv_source an earlier
  /// KV-owning layer of the same type, head size and KV heads.
  void validate() const;
};

}  // namespace kestrel::model
