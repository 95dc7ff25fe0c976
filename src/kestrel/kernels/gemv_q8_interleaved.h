// Products of a Q8_0 matrix with int8-quantized activations over a copy whose rows are
// interleaved in blocks of 16 (x86 AVX512-VNNI `vpdpbusd` or AVX2 `vpmaddubsw`, with a scalar
// path computing the same numbers bit for bit: int8_isa.h), for FlashHead's stage 1 (the cluster scores).
//
// Stage 1 only ranks clusters, so it may round the activations: each token's float32 vector is
// quantized per block of 32 (the Q8_0 block) to int8 with scale d = max|x| / 127, q =
// round-to-nearest-even(x / d) — the activation rounding llama.cpp applies in its quantized
// matrix products. Then per row r and token t, in block order b (float32, fused multiply-add):
//   y = fma(float(sum_{i in b} w_ri * q_ti), s_rb * d_tb, y),   y starting at 0,
// with w the int8 codes and s_rb the fp16 block scale of the matrix: the integer sums are exact.
// In the interleaved copy a 64-byte load holds 4 columns of 16 rows (codes + 128 as uint8, the
// unsigned operand of vpdpbusd; 128 * sum q is subtracted back); the 16 rows' block scales are
// one vector. One vpdpbusd is 64 multiply-adds, against 16 for the float32 path of matmul.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/kernels/int8_isa.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::kernels {

/// The arrays an interleaved copy owns (interleave_q8_0).
struct Q8InterleavedStorage {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

/// A Q8_0 matrix with its rows interleaved in blocks of 16, rows padded with zeros to a multiple
/// of 16. The arrays are views: into `owned` (interleave_q8_0: an owning copy), or into memory
/// that outlives this struct (a Kestrel image's mapped tensors, which may store this layout:
/// image/q8_tensors.h). Copies share `owned`. The kernels read the spans alone.
struct Q8Interleaved {
  size_t rows = 0;         // the matrix's rows (the copy holds padded_rows())
  size_t cols = 0;         // a multiple of 32
  std::span<const uint8_t> codes;  // [padded_rows / 16][cols / 4][64]: byte 4i + e = code(16B + i, 4c + e) + 128
  std::span<const float> scales;   // [padded_rows / 16][cols / 32][16]: the fp16 block scales as float32
  std::shared_ptr<const Q8InterleavedStorage> owned;  // null: a view of outside memory
  size_t padded_rows() const { return (rows + 15) / 16 * 16; }
  /// Bytes held in `owned` (0 for a view of an image's tensors).
  size_t owned_bytes() const {
    return owned ? owned->codes.size() + owned->scales.size() * sizeof(float) : 0;
  }
};

/// The interleaved copy of `w` (kQ8_0, cols a multiple of 32; throws kestrel::Error otherwise);
/// blocks of 16 rows split over `pool`'s threads when one is given.
Q8Interleaved interleave_q8_0(const Matrix& w, ThreadPool* pool = nullptr);

/// Throws kestrel::Error unless `il` has a shape the kernels run (cols a positive multiple of 32,
/// rows > 0) and its arrays the sizes the layout gives: codes padded_rows * cols bytes, scales
/// padded_rows * cols / 32 floats. A view of an image's tensors is checked with this.
void check_q8_interleaved(const Q8Interleaved& il);

/// The inverse of interleave_q8_0, bit for bit: the ggml Q8_0 rows (rows * cols / 32 blocks of 34
/// bytes: fp16 scale, 32 int8 codes) whose copy `il` is; the float32 scales narrow back to fp16
/// exactly (they were fp16). Where a run does not take the int8 kernels (bf16 activations, a CPU
/// without SIMD int8) the loader reads an image's stored layout through this. Throws as
/// check_q8_interleaved.
std::vector<std::byte> deinterleave_q8_0(const Q8Interleaved& il, ThreadPool* pool = nullptr);

/// Activations quantized per block of 32 as the header describes: per token, `cols` int8 values,
/// cols / 32 float32 scales and cols / 32 sums 128 * sum(q) (int32).
struct Q8Activations {
  size_t n_tokens = 0, cols = 0;
  std::vector<int8_t> q;          // [n_tokens][cols]
  std::vector<float> scale;       // [n_tokens][cols / 32]
  std::vector<int32_t> sum128;    // [n_tokens][cols / 32]
};

/// Quantizes x[t * x_stride + i] (t < n_tokens, i < cols, cols a multiple of 32) into `out`
/// (resized; reused without allocating once large enough).
void quantize_q8_activations(const float* x, size_t n_tokens, size_t x_stride, size_t cols, Q8Activations& out);

/// y[t * y_stride + r] for every token of `x` and r in [row_begin, row_end) (at most il.rows),
/// computed as the header says on the fastest path this CPU has (best_int8_isa(), int8_isa.h:
/// AVX512-VNNI, AVX2, else gemv_q8_interleaved_scalar); every path gives the same bits. Each result is the same whatever
/// the number of tokens and the row range (a block cut by the range is computed whole).
void gemv_q8_interleaved(const Q8Interleaved& il, const Q8Activations& x, float* y, size_t y_stride,
                         size_t row_begin, size_t row_end);

/// gemv_q8_interleaved on the path of `isa` (throws kestrel::Error where
/// int8_isa_available(isa) is false). For tests and benchmarks.
void gemv_q8_interleaved_on(Int8Isa isa, const Q8Interleaved& il, const Q8Activations& x, float* y,
                            size_t y_stride, size_t row_begin, size_t row_end);

/// Row r's result for token t of `x`: the bits gemv_q8_interleaved writes there, for one row
/// alone (a few tokens' logits: runtime's rescoring). Throws kestrel::Error past the rows/tokens.
float gemv_q8_interleaved_row(const Q8Interleaved& il, const Q8Activations& x, size_t t, size_t r);

/// The portable path of gemv_q8_interleaved (every CPU; used by tests).
void gemv_q8_interleaved_scalar(const Q8Interleaved& il, const Q8Activations& x, float* y, size_t y_stride,
                                size_t row_begin, size_t row_end);

/// Rows [row0, row0 + 16) of the Q8_0 matrix `w` as stored, for tokens [t_begin, t_end) of x:
/// y[(t - t_begin) * y_stride + r - row0], the bits gemv_q8_interleaved writes, through an
/// interleaved copy of those 16 rows made here (a thread's buffer, reused). For products of
/// many tokens over a matrix that has no interleaved copy (gemv_q8_rows.h: the rows kernel's
/// horizontal sums cost more per token than the copy of 16 rows). AVX512-VNNI only: throws
/// kestrel::Error where vnni_available() is false, past the rows or the tokens.
void gemv_q8_rows_block16_vnni(const Matrix& w, size_t row0, const Q8Activations& x, size_t t_begin, size_t t_end,
                               float* y, size_t y_stride);

/// True when the CPU runs AVX512-VNNI (and AVX512-BW) and KESTREL_NO_VNNI is not set.
bool vnni_available();

}  // namespace kestrel::kernels
