// Causal (optionally sliding-window) grouped-query attention of a chunk of queries over a
// layer's fp16 KV cache, split over the thread pool. The Gemma decoder calls it on every layer
// with that layer's shape (Gemma 4's layers differ in head size) and cache (a KV-shared layer
// reads its source layer's).
#pragma once

#include <cstddef>
#include <span>

#include "kestrel/base/thread_pool.h"
#include "kestrel/model/model.h"

namespace kestrel::model {

struct AttentionShape {
  size_t n_heads = 0;
  size_t n_kv_heads = 0;  // divides n_heads; query head h reads KV head h / (n_heads / n_kv_heads)
  size_t head_dim = 0;
  size_t window = 0;      // sliding window W (a query at p sees p-W+1 .. p); 0 = global
  /// Prefill tiles may take bfloat16 products (kernels/attention_bf16.h) where the CPU has
  /// AVX512-BF16: set where the layers' products take int8 activations (INT4 and Q8_0 layers
  /// with their int8 copies, the default on AVX512-VNNI), whose accuracy rule (docs/benchmarks.md:
  /// no worse than llama.cpp's own 8-bit rounding) this rounding is measured under. With bf16
  /// activations, and for float32 / BF16 / FP16 layers (the llama.cpp and transformers parity
  /// paths, the BF16 baseline that KL is measured against), attention stays float32.
  bool bf16_tiles = false;
};

/// out[t] = softmax(q[t] . K) V for t < n, the query at position pos0 + t seeing the cached
/// positions its mask allows (causal, and within the window when one is set).
///   q:   float32 [n, n_heads * head_dim], already multiplied by the attention scale;
///   lc:  a cache that holds positions up to pos0 + n - 1 (and, for a sliding layer, at least
///        the window before pos0); slots per KvCache's rule p % capacity;
///   out: float32 [n, n_heads * head_dim].
/// Prefill takes tiles of tokens per KV head; decode cuts a visible range longer than 128
/// positions into slices (128 positions below a range of 8,192, then longer with the range, up
/// to 1,024: attention.cpp's slice_length) and merges their partial softmaxes. Neither plan
/// depends on the thread count, so neither do the results (tests/model/test_llamacpp_parity.cpp,
/// ThreadCount; tests/model/test_attention_long_range.cpp). A chunk of fewer than
/// kernels::kTileMinTokens tokens computes each row exactly as a one-token call at its position
/// would (as the matmuls do below that size), so that the rows of a speculative verification
/// step equal the decode steps they stand for, bit for bit.
void cached_attention(const AttentionShape& shape, const float* q, size_t n, size_t pos0,
                      const LayerCache& lc, float* out, ThreadPool& pool);

/// One query row that attends on its own: a decode row of a batched step, or a row of a short
/// chunk (a speculative verification).
struct AttentionRow {
  const float* q;          // float32 [n_heads * head_dim], already scaled
  size_t pos;              // the row's position; the cache holds it and its visible range
  const LayerCache* cache;
  float* out;              // float32 [n_heads * head_dim]
};

/// cached_attention() of rows that each stand alone, over their own caches: each row's output
/// is bit-identical to cached_attention(shape, row.q, 1, row.pos, *row.cache, row.out, pool)
/// (which is this with one row), and all rows' work runs in one parallel loop: a batched
/// decode step or a verification waits for the pool once per layer, not once per row.
/// Allocates nothing once warm (the buffers are the calling thread's and the workers').
void cached_attention_rows(const AttentionShape& shape, std::span<const AttentionRow> rows, ThreadPool& pool);

}  // namespace kestrel::model
