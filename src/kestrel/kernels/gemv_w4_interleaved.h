// Decode GEMV for INT4 (kW4) matrices over a copy with the rows interleaved in blocks of 16
// (x86 AVX512-BF16 `vdpbf16ps`), for 1 to kTileMinTokens - 1 tokens.
//
// gemv_w4_bf16 computes one row at a time: per row it prepares the group scales and offsets and
// ends with horizontal sums, which at Gemma 3 270M's 640 columns weigh as much as the dot
// products. Here 16 rows share every instruction: a 64-byte load holds 8 columns of 16 rows;
// after the same unpacking (code q -> bfloat16 128 + q by interleaving with the byte 0x43),
// float32 lane i of a `vdpbf16ps` is row i and its two words a pair of columns, against that
// pair of bf16 activations broadcast to every lane. A group's 16 scales and offsets are one
// vector each, and a block ends with its 16 sums in one vector:
//   y_r = sum_g [ d_rg * sum_{i in g} (128 + q_ri) x_i + (m_rg - 128 d_rg) * sum_{i in g} x_i ]
// (m_rg = -8 d_rg for symmetric groups), the activations rounded to bf16, float32 arithmetic.
// Measured against gemv_w4_bf16 on one core (bench/w4_interleaved_bench.cpp): 2.0-2.5x at
// 2048 x 640 for 1-4 tokens. Each token's result is the same whatever the number of tokens
// computed with it and whatever rows range the call covers (bit for bit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kestrel/kernels/matmul.h"

namespace kestrel::kernels {

/// Rows per interleaved block.
inline constexpr size_t kInterleaveRows = 16;

/// The interleaved copy of a kW4 matrix. Per block of 16 rows, per 8 columns, 64 bytes of codes;
/// per block and group, the 16 rows' group parameters: fp16 scales d and fp16 minimums m (m = -8 d
/// for symmetric groups, exact in fp16), or, for a matrix with 8-bit group parameters (matmul.h),
/// the 16 rows' u8 s_g and n_g beside per-row float32 d_row and m_row, from which the kernel forms
/// d = d_row * s_g and m = -m_row * n_g as float32 products, as the row-major kernel does.
struct W4Interleaved {
  size_t rows = 0;  // a multiple of kInterleaveRows
  size_t cols = 0;
  size_t group_size = 0;
  std::vector<uint8_t> codes;     // [rows / 16][cols / 8][64]
  std::vector<uint16_t> scales;   // fp16 [rows / 16][cols / group_size][16] (16-bit parameters)
  std::vector<uint16_t> mins;     // fp16 [rows / 16][cols / group_size][16] (16-bit parameters)
  std::vector<uint8_t> scales8;   // u8 s_g [rows / 16][cols / group_size][16] (8-bit parameters)
  std::vector<uint8_t> mins8;     // u8 n_g, same shape; empty: symmetric groups, m = -8 d
  std::vector<float> row_d;       // [rows] d_row (8-bit parameters)
  std::vector<float> row_m;       // [rows] m_row (8-bit parameters)
  bool params8() const { return !scales8.empty(); }
};

/// True when the interleaved kernel can run `w`: kW4 (16- or 8-bit group parameters), rows a
/// multiple of 16, group_size a multiple of 8, the CPU has AVX512-BF16 (bf16_dot_available()),
/// and KESTREL_NO_INTERLEAVE is not set (for A/B runs against gemv_w4_bf16).
bool w4_interleavable(const Matrix& w);

/// The interleaved copy of `w` (w4_interleavable(w) must hold; throws kestrel::Error if not).
W4Interleaved interleave_w4(const Matrix& w);

/// y[t * y_stride + r] = sum_i W[r, i] * x[t * x_stride + i] for t < n_tokens (1 to
/// kTileMinTokens - 1), r in [row_begin, row_end) (at most il.rows), W = the matrix `il` was
/// made from, x float32. Results are bit-identical whatever n_tokens and the row range (a block
/// cut by the range is computed whole). Error: float32 rounding of the bf16 products, as
/// gemv_w4_bf16 (a different order, so not bit-identical to it).
void gemv_w4_interleaved(const W4Interleaved& il, const float* x, size_t n_tokens, size_t x_stride, float* y,
                         size_t y_stride, size_t row_begin, size_t row_end);

}  // namespace kestrel::kernels
