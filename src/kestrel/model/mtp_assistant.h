// Gemma 4's MTP "assistant" drafter: a small Gemma 4 decoder that proposes the next tokens from
// the target's own state, as HF transformers' Gemma4AssistantForCausalLM driven by
// SinglePositionMultiTokenCandidateGenerator does (transformers 5.24,
// models/gemma4_assistant/modeling_gemma4_assistant.py, generation/candidate_generator.py).
//
// One draft step, for the token t at position p = cache.n_past (the token the target has just
// chosen and not yet run) and a state h of the target's width D:
//   x  = W_pre [E_target[t] * sqrt(D), h]                          (pre_projection, 2D -> d)
//   per layer (all KV-shared: no K/V of its own):
//     a = rms(x) * w_in;  q = rope_p(rms_head(Wq a) * w_qnorm)      (attention scale 1)
//     o = softmax(q K^T) V over the target's cache of the target's last layer of the same type
//         (full: positions 0 .. p-1; sliding: the last W + 1 of them, p-1-W .. p-1, as HF's
//         flipped bidirectional sliding mask admits)
//     x += rms(Wo o) * w_post_attn;  x += rms(down(gelu_tanh(gate b) * up b)) * w_post_ffn,
//     b = rms(x) * w_ffn;  x *= layer_output_scale
//   n = rms(x) * w_out
//   logits = E_assist n (tied head, no soft-cap), or with the centroid-masked head: the top-k
//            of the centroid logits C n pick k clusters of V / n_centroids tokens each
//            (token_ordering), those tokens get E_assist[token] . n, every other token
//            min(those) - 1;
//   h' = W_post n                                                  (post_projection, d -> D)
// The first step takes h = the target's final hidden state (after its output norm) of the
// position before p, later steps h' of the previous step and its argmax as t, at the same p.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/model/gemma_decoder.h"
#include "kestrel/model/kv_cache.h"
#include "kestrel/model/weights.h"

namespace kestrel::model {

/// The assistant's configuration, from gemma4_assistant.* metadata (image/hf_gemma4_assistant.h).
struct MtpAssistantConfig {
  size_t n_layers = 0;
  size_t d_model = 0;        // the assistant's width d
  size_t d_backbone = 0;     // the target's width D
  size_t d_ff = 0;
  size_t n_heads = 0;
  size_t window = 0;         // sliding window W of its sliding layers (they read W + 1 positions)
  size_t n_centroids = 0;    // 0: the plain dense head
  size_t centroid_top_k = 0;
  size_t rotated_pairs = 0;  // full layers' rotated RoPE pairs (proportional RoPE)
  float rms_eps = 1e-6f;
  double rope_base = 1e6;      // full layers
  double rope_base_swa = 1e4;  // sliding layers
  std::vector<bool> sliding;
  std::vector<size_t> head_dim, n_kv_heads;

  /// The configuration in `file`, or nullopt when the file holds no assistant (no
  /// gemma4_assistant.block_count). Throws kestrel::Error for inconsistent metadata.
  static std::optional<MtpAssistantConfig> from_gguf(const gguf::File& file);
};

class MtpAssistant {
 public:
  /// True when `file` (a GGUF or image) carries an assistant.
  static bool in_file(const gguf::File& file);

  /// Loads the mtp.* weights of `file` (the same LoadOptions as the target's: an image is read
  /// in place) for `target`, which must be the model of that file. Throws kestrel::Error when the
  /// file has no assistant, a tensor is missing or misshapen, or the assistant does not fit the
  /// target (width, vocabulary, the K/V shape of the layers it reads).
  MtpAssistant(const gguf::File& file, const GemmaDecoder& target, const LoadOptions& options, ThreadPool& pool);

  const MtpAssistantConfig& config() const { return config_; }
  size_t n_vocab() const { return n_vocab_; }

  /// One draft step (the header's formula) for `token` at position cache.n_past.
  ///   hidden:      float32 [d_backbone], the target's last hidden state or the previous step's
  ///                next_hidden;
  ///   cache:       the target's cache (n_past >= 1; a sliding ring must still hold
  ///                n_past - 1 - W);
  ///   logits:      float32 [n_vocab] out;
  ///   next_hidden: float32 [d_backbone] out (may alias `hidden`).
  /// Throws kestrel::Error for an empty cache, a cache of another model, a ring that no longer
  /// holds the positions needed, or a token outside the vocabulary.
  void step(TokenId token, const float* hidden, const KvCache& cache, float* logits, float* next_hidden,
            ThreadPool& pool) const;

  /// n greedy drafts (argmax, first index on ties) from `token` and the target's `hidden`:
  /// what transformers' SinglePositionMultiTokenCandidateGenerator proposes. `logits`, when
  /// given, receives float32 [n, n_vocab].
  std::vector<TokenId> draft(TokenId token, const float* hidden, const KvCache& cache, size_t n, ThreadPool& pool,
                             std::vector<float>* logits = nullptr) const;

 private:
  struct Layer {
    const float* attn_norm = nullptr;
    kernels::Matrix wq, wo;
    const float* q_norm = nullptr;
    const float* post_attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    kernels::Matrix gate, up, down;
    const float* post_ffn_norm = nullptr;
    float out_scale = 1.0f;
    size_t kv_layer = 0;          // the target's layer whose cache it reads
    std::vector<float> inv_freq;  // [head_dim / 2]
  };

  /// logits = the output head of the normed state n (dense, or centroid-masked).
  void head(const float* n, float* logits, ThreadPool& pool) const;

  const GemmaDecoder* target_;
  MtpAssistantConfig config_;
  WeightStore store_;
  size_t n_vocab_ = 0;
  kernels::Matrix pre_proj_, post_proj_, output_, centroids_;
  const float* output_norm_ = nullptr;
  std::vector<uint32_t> token_ordering_;  // [n_vocab]: cluster c holds entries c*V/C .. (c+1)*V/C - 1
  std::vector<Layer> layers_;
};

}  // namespace kestrel::model
