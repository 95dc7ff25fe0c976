// The interface every architecture implements, and the KV cache it fills.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/head/output_head.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/model/kv_cache.h"
#include "kestrel/model/weights.h"

namespace kestrel::model {

/// Facts about a loaded model that callers need.
struct ModelInfo {
  std::string architecture;  // general.architecture, e.g. "gemma3"
  std::string name;          // general.name
  size_t n_vocab = 0;
  size_t d_model = 0;
  size_t n_layers = 0;
  size_t context_length = 0;  // the model's maximum (training) context
  size_t n_params = 0;
  /// Matrices whose products take int8 activations (the int8 copies made at load: INT4 layers,
  /// Q8_0 layers, a dense Q8_0 head; kernels/gemv_w4_int8.h); 0 where activations stay bf16/float32.
  size_t int8_matrices = 0;
  /// Bytes of the copies made at load (WeightStore::load_copy_bytes): kernel layouts, GGUF
  /// conversions, float32 vectors. The file's mapped pages they replace leave the resident set.
  size_t load_copy_bytes = 0;
  /// Bytes of the weights one decode step reads whatever the context: every layer matrix
  /// (kernels::Matrix::bytes) and the per-layer-input projection. Not counted: the output head
  /// (dense or FlashHead: runtime::Engine::decode_read_bytes adds it), the KV cache, and the
  /// embedding rows of the token (under 0.1 % on Gemma 3 and 4).
  size_t decode_weight_bytes = 0;
  /// The kernels its products run on here (kernels::kernel_label, kernels/registry.h): the
  /// layers' distinct ones in decode and in prefill (kernels::Phase), and the output head's.
  std::vector<std::string> layer_decode_kernels, layer_prefill_kernels;
  std::string head_decode_kernel, head_prefill_kernel;
};

enum class Logits { kLast, kAll };

/// A segment of this many tokens or more is a prefill segment: its attention runs by tiles and
/// its positions count as prefilled (KvCache::append); shorter ones (decode rows, short prompt
/// tails, verifications) run row by row as a decode step does.
inline constexpr size_t kPrefillMinRows = kernels::kTileMinTokens;

/// How a model keeps the batching promise (Model::batch_exactness).
enum class BatchExactness { kAnyRows, kShortApart };

/// One sequence's part of a batched forward pass (Model::forward_batch).
struct BatchSequence {
  std::span<const TokenId> tokens;  // appended at positions cache->n_past, n_past + 1, ...
  KvCache* cache = nullptr;         // this sequence's own cache
  float* hidden = nullptr;          // float32 [d_model]: the final hidden state (after the output norm) of its LAST token; may be null
  bool all_rows = false;            // hidden receives every token's row instead, float32 [tokens.size(), d_model] (embeddings)
};

/// Sees the input of every layer matrix during a forward pass (calibration statistics).
class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  /// `x`: float32 [n_tokens, cols], the input of the matrix named `matrix` (its GGUF name).
  virtual void observe(const std::string& matrix, const float* x, size_t n_tokens, size_t cols) = 0;
};

/// A decoder-only language model. Implementations keep pointers into the GGUF mapping, which
/// must outlive them.
class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelInfo& info() const = 0;

  /// A cache for a sequence of up to n_ctx positions (1 <= n_ctx <= context_length, else
  /// kestrel::Error).
  virtual KvCache new_cache(size_t n_ctx) const = 0;

  /// Runs `tokens` at positions cache.n_past, cache.n_past + 1, ... and advances n_past.
  /// Writes the final hidden states, after the output norm, float32 [rows, d_model]: one row
  /// (the last token) for Logits::kLast, tokens.size() rows for Logits::kAll. Throws
  /// kestrel::Error when the tokens do not fit in the cache or an id is outside the
  /// vocabulary (the cache is left unchanged then).
  virtual void forward_hidden(std::span<const TokenId> tokens, KvCache& cache, Logits which,
                              float* hidden, ThreadPool& pool,
                              ActivationObserver* observer = nullptr) const = 0;

  /// Several sequences in one pass: the layer matmuls over all their rows at once, attention per
  /// sequence over its own cache. Each sequence's `hidden` and cache end as forward_hidden(tokens,
  /// *cache, Logits::kLast, hidden) (Logits::kAll with all_rows) alone would leave them, up to the kernels' row-count-dependent
  /// rounding. Bit-identical where every matrix takes the same kernel path for the batch's row
  /// count as for the sequence's own: always for F32 and Q8_0 weights (Precision::kSource of
  /// Gemma 3 270M and the tiny Gemma 4s), and for fewer than 8 rows in all. From 8 rows, W4
  /// (and, on CPUs with bf16 dot products, BF16/FP16) matrices take bfloat16 tiles, so a
  /// sequence of fewer than 8 tokens is rounded otherwise than alone: measured max |logit
  /// difference| 0.65 on Gemma 3 270M W4A16 (logits up to ~37), same argmax; prefill rows of 8
  /// or more stay bit-identical (tests/model/test_forward_batch.cpp).
  /// The total token count must be <= max_batch_tokens() (else kestrel::Error). Every sequence
  /// is validated (as forward_hidden validates: empty, overflow of its context, ids outside the
  /// vocabulary, a cache of another model, the same cache twice) before any cache changes.
  virtual void forward_batch(std::span<const BatchSequence> seqs, ThreadPool& pool) const = 0;
  /// The most tokens forward_batch takes at once (the models' kMaxUbatch, 256).
  virtual size_t max_batch_tokens() const = 0;
  /// The batching promise as this model can keep it (the scheduler groups a step's sequences by
  /// it, so that batching never changes an answer): kAnyRows when every layer product computes a
  /// row the same whatever the rows beside it (kernels::matmul_rows_invariant of every matrix:
  /// the int8 kernels), so that forward_batch of any sequences leaves each bit for bit as
  /// forward_hidden alone; kShortApart when products of kPrefillMinRows rows or more round
  /// otherwise (bf16 prefill tiles, the opt-in W8A8 copy or AMX tiles), so that sequences of
  /// fewer tokens must share passes of fewer than kPrefillMinRows rows.
  virtual BatchExactness batch_exactness() const = 0;

  /// The dense output head that turns those hidden states into logits.
  virtual const head::OutputHead& output_head() const = 0;

  /// forward_hidden followed by the dense head: float32 logits [n_vocab] for Logits::kLast,
  /// [tokens.size(), n_vocab] for Logits::kAll, in token order. Errors as forward_hidden.
  void forward(std::span<const TokenId> tokens, KvCache& cache, Logits which, float* logits,
               ThreadPool& pool, ActivationObserver* observer = nullptr) const;
};

/// Builds the model named by general.architecture. Throws kestrel::Error for an unknown
/// architecture or missing / misshapen tensors.
/// Throws kestrel::Error when `what` needs more bytes than the machine's physical memory.
void check_memory(const std::string& what, size_t bytes);

/// MemAvailable of a /proc/meminfo text, in bytes; nullopt when the text has none.
std::optional<size_t> mem_available_bytes(std::string_view meminfo);
/// Memory the kernel can give now without swapping: /proc/meminfo's MemAvailable (free memory
/// plus the page cache it can reclaim), else the machine's physical memory.
size_t available_memory();
/// "1.5 GiB", "300 MiB": a byte count for messages.
std::string format_bytes(size_t bytes);

/// Layer matrices are converted to options.precision (using `pool` to quantize).
std::unique_ptr<Model> load_model(const gguf::File& file, const LoadOptions& options,
                                  ThreadPool& pool);

}  // namespace kestrel::model
