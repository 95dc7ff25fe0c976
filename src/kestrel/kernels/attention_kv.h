// Attention over a KV cache stored as fp16, bfloat16 or int8 (q8: llama.cpp's q8_0 layout idea,
// int8 values with an fp16 scale per block of a head's dimensions), and the row conversions that
// write and read such a cache. ops.h keeps the fp16-only kernels the default cache runs; these
// take any element type for K and V separately (`--cache-type-k` / `--cache-type-v`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kestrel::kernels {

/// The element type of a K or V cache.
enum class KvType : uint8_t {
  kF16 = 0,   // IEEE half, rounded to nearest even
  kBF16 = 1,  // bfloat16, rounded to nearest even
  kQ8 = 2,    // int8 in [-127, 127] times an fp16 scale per block of kvq8 elements of one head
};

/// "f16", "bf16" or "q8".
const char* kv_type_name(KvType t);
/// Reads a name: f16 (also fp16), bf16, q8 (also q8_0, llama.cpp's name). Throws kestrel::Error
/// naming `option` and the accepted names otherwise.
KvType parse_kv_type(const std::string& name, const std::string& option);

/// Elements per q8 scale for a head of head_dim: the largest power of two <= 32 that divides it
/// (32 for every Gemma head).
size_t kv_q8_block(size_t head_dim);

/// Bytes one cache row of `elems` elements takes in type t with q8 blocks of `block`: 2 per element
/// (f16, bf16), or 1 per element plus 2 per block (q8).
size_t kv_row_bytes(KvType t, size_t elems, size_t block);

/// One KV head of one layer's K or V cache: position p lives in slot p % capacity.
///   data:   element 0 of the head in slot 0: uint16_t (f16, bf16) or int8_t (q8);
///   scales: q8: the fp16 scale of the head's first block in slot 0 (null otherwise);
///   stride: elements per slot (all heads), scale_stride: scales per slot (q8);
///   block:  q8 elements per scale (a power of two dividing head_dim).
struct KvHeadView {
  KvType type = KvType::kF16;
  const void* data = nullptr;
  const uint16_t* scales = nullptr;
  size_t stride = 0;
  size_t scale_stride = 0;
  size_t block = 32;
};

/// Writes x[0..n) (float32, n a multiple of block for q8) into a cache row of type t: `out` is
/// uint16_t[n] (f16, bf16) or int8_t[n] with `scales` fp16[n / block] (q8). q8: per block,
/// d = max|x| / 127 rounded to fp16, q = x / d rounded to nearest (ties to even), clamped to
/// [-127, 127]; d = 0 (all q 0) for a block of zeros. Non-finite inputs give a non-finite scale.
void kv_write_row(KvType t, const float* x, size_t n, size_t block, void* out, uint16_t* scales);
/// The inverse: y[0..n) = the row's values as float32 (exact: q * d is exact in float32).
void kv_read_row(KvType t, const void* row, const uint16_t* scales, size_t n, size_t block, float* y);

/// In place: x[0..n) = H x / sqrt(n), H the n x n Walsh-Hadamard matrix (Sylvester's order; n a
/// power of two): an orthonormal rotation that is its own inverse, so that (H q) . (H k) = q . k.
/// Rotating K before q8 rounding spreads a head's outlier dimensions over all of its blocks
/// (QuaRot, Ashkboos et al. 2024; llama.cpp rotates quantized KV the same way). Throws
/// kestrel::Error when n is not a power of two.
void hadamard_rotate(float* x, size_t n);

/// attend_group() (ops.h) over typed views: the `group` query heads q [group, head_dim] (scaled)
/// of one KV head, over positions [pos_begin, pos_end), out [group, head_dim] normalized.
/// `scores` needs group * (pos_end - pos_begin) floats. Each K row's products are summed in
/// float32 from the dequantized values (q8: int8 widened and times its block's scale), the
/// same bits on every SIMD target up to the order of the float32 sums.
void attend_group_kv(const float* q, size_t group, const KvHeadView& k, const KvHeadView& v, size_t capacity,
                     size_t head_dim, size_t pos_begin, size_t pos_end, float* scores, float* out);
/// The unnormalized partial of a slice (ops.h's AttentionPartial: out, max, sum per head).
void attend_partial_kv(const float* q, size_t group, const KvHeadView& k, const KvHeadView& v, size_t capacity,
                       size_t head_dim, size_t pos_begin, size_t pos_end, float* scores, float* out_unnormalized,
                       float* max_out, float* sum_out);
/// attend_block() (ops.h) over typed views: n_queries (1..16) queries of one KV head, query i
/// seeing [begins[i], ends[i]); `scores` needs n_queries * (max end - min begin) floats. Per
/// query the same bits as attend_group_kv over its range.
void attend_block_kv(const float* const* queries, size_t n_queries, const size_t* begins, const size_t* ends,
                     const KvHeadView& k, const KvHeadView& v, size_t capacity, size_t head_dim, float* scores,
                     float* const* outs);

}  // namespace kestrel::kernels
