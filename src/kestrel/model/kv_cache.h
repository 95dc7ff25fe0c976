// The KV cache of one sequence: per-layer keys and values (fp16 by default; bf16 or int8 with
// block scales on request), the token ids they were computed from, and the truncate / rollback
// contract that prefix reuse (and later speculative decoding) relies on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kestrel/kernels/attention_kv.h"

namespace kestrel::model {

using TokenId = int32_t;
using kernels::KvType;

/// The element types of the K and V caches (`--cache-type-k` / `--cache-type-v`).
struct KvTypes {
  KvType k = KvType::kF16;
  KvType v = KvType::kF16;
  /// q8 K and V: rotate each head by the Walsh-Hadamard matrix before rounding
  /// (kernels::hadamard_rotate; the attention rotates the queries alike and its outputs back).
  /// KESTREL_KV_HADAMARD=1 for A/B runs.
  bool k_hadamard = false;
  bool operator==(const KvTypes&) const = default;
};

/// "f16", "q8", or "K q8, V f16" when they differ.
std::string kv_types_name(const KvTypes& t);

/// K or V of one layer: [capacity, stride] elements of `type`. f16 / bf16 in `half`; q8 in `q`
/// (int8) with fp16 `scales` [capacity, stride / block] (a scale per block of `block` elements,
/// blocks never straddling two heads).
struct KvTensor {
  KvType type = KvType::kF16;
  size_t stride = 0;
  size_t block = 32;
  size_t head_dim = 0;
  bool rotated = false;  // q8: each head stored as H x / sqrt(head_dim) (KvTypes::k_hadamard)
  std::vector<uint16_t> half;
  std::vector<int8_t> q;
  std::vector<uint16_t> scales;

  bool operator==(const KvTensor&) const = default;
  /// Bytes one slot (all heads of one position) takes: kernels::kv_row_bytes.
  size_t slot_bytes() const { return kernels::kv_row_bytes(type, stride, block); }
  /// Bytes held.
  size_t bytes() const { return half.size() * 2 + q.size() + scales.size() * 2; }
  /// Writes the float32 row x [stride] (all heads) into `slot` in this type (kernels::kv_write_row).
  void write(size_t slot, const float* x);
  /// The slot's bytes (slot_bytes() of them: the elements, then q8's scales) to / from `bytes`:
  /// the prefix cache's copies.
  void copy_out(size_t slot, uint8_t* bytes) const;
  void copy_in(size_t slot, const uint8_t* bytes);
  /// The view of KV head g (hd elements from g * hd in each slot) for the kernels.
  kernels::KvHeadView head(size_t g, size_t hd) const;
};

/// Keys and values of one layer [capacity, stride]. Position p lives in slot p % capacity.
/// A global layer holds one slot per context position; a sliding-window layer of window W keeps
/// a ring of W + ubatch - 1 slots (enough for a chunk of ubatch queries to see their windows
/// while the chunk's own keys are written); a layer that reads another's cache (Gemma 4 KV
/// sharing) has capacity 0.
struct LayerCache {
  size_t capacity = 0;
  size_t stride = 0;  // elements per slot: n_kv_heads * head_dim
  size_t window = 0;  // sliding window W in positions; 0 = global (every position kept)
  KvTensor k, v;
};

/// What a model asks of one layer's cache (KvCache::allocate).
struct LayerCacheSpec {
  size_t capacity = 0;
  size_t stride = 0;
  size_t window = 0;
  size_t head_dim = 0;  // q8 blocks divide it (kernels::kv_q8_block); 0: stride
};

/// The KV cache of one sequence.
///
/// Contract: positions [0, n_past) hold the keys and values of `tokens()` (the model's forward
/// pass appends through append()). truncate(n) forgets positions n.. and keeps the rest exact,
/// so that feeding tokens after it gives bit-for-bit the results that feeding the same tokens to
/// a cache holding only the first n would give. A sliding-window ring can make that impossible:
/// its slots for positions n-W+1 .. n-1 may already hold later positions. Recomputing them would
/// need the layers below at even earlier positions (each sliding layer widens the need by W-1),
/// so truncate then keeps nothing and says so: the caller re-feeds from the returned position.
struct KvCache {
  std::vector<LayerCache> layers;
  size_t n_ctx = 0;   // positions the sequence may reach
  size_t n_past = 0;  // positions written and valid (== tokens().size())

  /// Allocates one LayerCache per spec (zeros) of the element types `types` for a sequence of up
  /// to n_ctx positions. Throws kestrel::Error when the total exceeds the machine's physical
  /// memory.
  static KvCache allocate(size_t n_ctx, const std::vector<LayerCacheSpec>& specs, const KvTypes& types = {});
  /// Bytes the specs need: capacity * (K's + V's slot bytes), summed: 4 bytes per element pair
  /// for f16 / bf16, 2 + 4 / 32 for q8 (llama.cpp's q8_0 size).
  static size_t bytes_for(const std::vector<LayerCacheSpec>& specs, const KvTypes& types = {});

  /// The element types of K and V.
  KvTypes types() const { return types_; }
  /// Bytes held by keys and values.
  size_t bytes() const;
  /// Bytes of keys and values that the query of the next position (n_past) reads: per layer with
  /// a cache of its own, K's and V's slot bytes for each of the min(n_past + 1, window)
  /// positions it attends to (all n_past + 1 on a global layer). KV-shared layers read their
  /// source's cache again and are not counted twice.
  size_t read_bytes() const;
  /// The token ids at positions [0, n_past).
  std::span<const TokenId> tokens() const { return tokens_; }
  /// Records that `ids` were written at positions n_past.. and advances n_past (called by the
  /// model once a forward chunk's keys and values are in place). `prefill`: written by a chunk of
  /// prefill size (kernels::kTileMinTokens or more: prefill tiles), as a cold run writes every
  /// prompt position; rows written otherwise (decode steps, verifications, prompts of fewer
  /// tokens) round differently and end prefilled().
  void append(std::span<const TokenId> ids, bool prefill = false);
  /// Positions [0, prefilled()) were all written by chunks of prefill size: the ones a prompt
  /// may reuse and still get a cold run's bits (Session::reuse_prefix).
  size_t prefilled() const { return prefilled_; }
  /// The largest m <= n such that truncate(m) keeps m positions exactly: n itself, or 0 when a
  /// ring no longer holds the window that position n's query needs.
  size_t exact_prefix(size_t n) const;
  /// Forgets positions >= n (n <= n_past, else kestrel::Error) and returns how many positions are
  /// kept: exact_prefix(n), i.e. n, or 0 when a sliding ring has lost the window before n. The
  /// memory is kept either way.
  size_t truncate(size_t n);
  /// Forgets the sequence (keeps the memory).
  void clear();
  /// Takes `ids` as the sequence's positions [0, ids.size()), all of prefill size (prefilled() ==
  /// n_past == ids.size()), after the caller wrote their keys and values into the layers: every
  /// global layer's slots 0 .. n-1, and each ring's slots of positions max(0, n - capacity) .. n-1
  /// (the runtime's prefix cache restores a stored prefix this way). The state then equals a cold
  /// prefill's of the same tokens: ring_floor() is max(0, n - the smallest ring capacity). Throws
  /// kestrel::Error when ids do not fit n_ctx.
  void adopt_prefix(std::span<const TokenId> ids);
  /// The oldest position that every sliding-window ring still holds (0 until a ring wraps):
  /// readers that look further back than a query's own window (Gemma 4's MTP assistant reads
  /// one position more) check it.
  size_t ring_floor() const { return ring_floor_; }

 private:
  std::vector<TokenId> tokens_;
  KvTypes types_;
  size_t prefilled_ = 0;
  // Every ring holds all positions in [ring_floor_, n_past): writing position p overwrote
  // p - capacity of each ring, so ring_floor_ = max over writes of (p + 1 - min ring capacity).
  size_t ring_floor_ = 0;
  size_t min_ring_capacity() const;
  size_t max_ring_window() const;
};

/// Length of the longest common prefix of a and b.
size_t common_prefix(std::span<const TokenId> a, std::span<const TokenId> b);

}  // namespace kestrel::model
