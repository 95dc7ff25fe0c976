// Prefill attention with bfloat16 dot products (x86 AVX512-BF16: vdpbf16ps, 32 multiply-adds
// per instruction into float32, twice the float32 FMA rate on Zen 4: Compute/PeakBf16Dot).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kestrel/kernels/attention_kv.h"

namespace kestrel::kernels {

/// True where this CPU has AVX512-BF16, neither KESTREL_NO_BF16_DOT nor
/// KESTREL_NO_BF16_ATTENTION (for A/B runs of attention alone) is set, and head_dim is a
/// multiple of 32 up to 512: the cases attend_block_bf16 takes.
bool bf16_attention_available(size_t head_dim);

/// One KV head's cache over positions [first, end) in bfloat16, converted once for all the
/// tiles of a prefill chunk. first is even and end - first a multiple of 16.
///   k: blocks of 16 positions (block b: first + 16 b ...), each [head_dim / 2][16][2]: for each
///      pair of elements (2c, 2c + 1), the 16 rows' pairs side by side, so that one vdpbf16ps
///      gives a query's scores against 16 positions in its 16 lanes;
///   v: [(end - first) / 2][2 head_dim]: pair m holds positions first + 2m and first + 2m + 1
///      element by element (v_a[0], v_b[0], v_a[1], v_b[1], ...), the operand order of vdpbf16ps.
struct KvBf16 {
  const uint16_t* k;
  const uint16_t* v;
  size_t first, end;
};

/// Fills positions [p0, p1) (first + multiples of 16; within [first, end) of the KvBf16 that
/// k_out / v_out are the buffers of) from the fp16 cache of one KV head (slot p % capacity at k + slot * stride),
/// rounding to nearest even. Positions from `valid_end` on (the padding of the last block) are
/// zero rows. Disjoint ranges may be filled by different threads.
void kv_to_bf16(const uint16_t* k, const uint16_t* v, size_t stride, size_t capacity, size_t head_dim,
                size_t first, size_t valid_end, size_t p0, size_t p1, uint16_t* k_out, uint16_t* v_out);

/// kv_to_bf16() from a typed cache (attention_kv.h: f16, bf16 or q8, K and V each their own):
/// the values are widened to float32 exactly, then rounded to bfloat16, so an fp16 cache gives
/// the bits of the overload above.
void kv_to_bf16(const KvHeadView& k, const KvHeadView& v, size_t capacity, size_t head_dim, size_t first,
                size_t valid_end, size_t p0, size_t p1, uint16_t* k_out, uint16_t* v_out);

/// attend_block() (ops.h) over a converted cache: n_queries (1..16) float32 query vectors, query i
/// seeing positions [begins[i], ends[i]) (within [kv.first, kv.end)), outs[i] its output
/// [head_dim]. Q and the softmax weights are rounded to bfloat16 as K and V are (8 significant
/// bits, round to nearest even) and every product is summed in float32: a score over the pairs
/// of elements in order, the output over the pairs of positions (2m, 2m + 1) in order. A
/// query's output depends only on its vector, its range and the cache, not on the other queries
/// of the tile nor where the tile starts: prefill chunks cut at other tokens give the same bits.
/// bf16_attention_available(head_dim) must hold (the caller's to check).
void attend_block_bf16(const float* const* queries, size_t n_queries, const size_t* begins,
                       const size_t* ends, const KvBf16& kv, size_t head_dim, float* const* outs);

}  // namespace kestrel::kernels
