// Gemma 4's MTP "assistant" drafter (HF transformers `gemma4_assistant`,
// Gemma4AssistantForCausalLM) from its Hugging Face checkpoint into the target's GGUF, and so
// into the target's image: `kestrel build TARGET_DIR --assistant ASSISTANT_DIR`.
//
// The assistant is a small Gemma 4 text decoder whose layers are all KV-shared: its queries read
// the target's K/V (the target's last full-attention and last sliding layer) and it computes no
// K/V of its own. Its input is [target embedding of the last token, target hidden state]
// through `pre_projection`; `post_projection` maps its output back to the target's width for the
// next draft; its output head is its own (tied) embedding, optionally "centroid-masked"
// (`use_ordered_embeddings`: only the tokens of the top-k of `num_centroids` clusters are
// scored). docs/speculative.md, "Gemma 4 MTP assistant", has the forward pass.
//
// Tensors go under "mtp." (names as the target's, e.g. mtp.blk.0.attn_q.weight,
// mtp.token_embd.weight, mtp.pre_proj.weight, mtp.post_proj.weight, mtp.centroids.weight,
// mtp.token_ordering.weight as F32), the configuration under "gemma4_assistant.*" (mtp_keys
// below). `kestrel build` stores the 2-D ones as it stores the embedding (the source's type in
// w4a16 images unless --embedding says otherwise, BF16 in bf16 images) and the vectors as F32.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

namespace kestrel::gguf {
class Writer;
}

namespace kestrel::image {

namespace mtp_keys {
inline constexpr const char* kBlockCount = "gemma4_assistant.block_count";
inline constexpr const char* kEmbeddingLength = "gemma4_assistant.embedding_length";
inline constexpr const char* kBackboneLength = "gemma4_assistant.backbone_embedding_length";
inline constexpr const char* kFeedForwardLength = "gemma4_assistant.feed_forward_length";
inline constexpr const char* kHeadCount = "gemma4_assistant.attention.head_count";
inline constexpr const char* kHeadCountKv = "gemma4_assistant.attention.head_count_kv";      // per layer
inline constexpr const char* kKeyLength = "gemma4_assistant.attention.key_length";           // per layer
inline constexpr const char* kSlidingWindow = "gemma4_assistant.attention.sliding_window";
inline constexpr const char* kSlidingPattern = "gemma4_assistant.attention.sliding_window_pattern";  // per layer
inline constexpr const char* kRmsEps = "gemma4_assistant.attention.layer_norm_rms_epsilon";
inline constexpr const char* kRopeBase = "gemma4_assistant.rope.freq_base";          // full layers
inline constexpr const char* kRopeBaseSwa = "gemma4_assistant.rope.freq_base_swa";   // sliding layers
/// Full layers: RoPE pairs rotated (proportional RoPE: partial_rotary_factor * head_dim / 2;
/// the rest rotate by angle 0). Sliding layers rotate every pair.
inline constexpr const char* kRopeRotatedPairs = "gemma4_assistant.rope.rotated_pairs";
/// Clusters of the centroid-masked head (0: the plain dense head) and how many are scored.
inline constexpr const char* kCentroids = "gemma4_assistant.centroids";
inline constexpr const char* kCentroidTopK = "gemma4_assistant.centroid_top_k";
}  // namespace mtp_keys

/// The GGUF name of assistant tensor `name` ("token_embd.weight" -> "mtp.token_embd.weight").
std::string mtp_name(const std::string& name);

/// True when `dir/config.json` declares model_type "gemma4_assistant".
bool is_hf_gemma4_assistant(const std::filesystem::path& dir);

/// What the assistant must agree with: the target's hidden width, vocabulary, and the shape of
/// the K/V its layers read.
struct AssistantTarget {
  uint64_t d_model = 0;
  uint64_t n_vocab = 0;
  uint64_t n_kv_heads = 0;
  uint64_t head_dim_sliding = 0;
  uint64_t head_dim_full = 0;
};

/// An assistant checkpoint, read and checked, ready to be appended to a GGUF being written.
class HfGemma4Assistant {
 public:
  /// Reads dir/config.json and the safetensors index, checks every tensor's shape and the
  /// configuration against `target`. Throws kestrel::Error naming the file and the problem.
  HfGemma4Assistant(const std::filesystem::path& dir, const AssistantTarget& target,
                    const std::function<void(const std::string&)>& log = {});
  ~HfGemma4Assistant();
  HfGemma4Assistant(HfGemma4Assistant&&) noexcept;

  /// Adds the gemma4_assistant.* metadata and the mtp.* tensor infos (before begin_data).
  void add_header(gguf::Writer& w) const;
  /// Writes the tensors' data in the order add_header declared them (after the target's).
  void write_data(gguf::Writer& w) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel::image
