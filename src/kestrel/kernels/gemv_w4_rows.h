// Products of an INT4 (kW4) matrix, its rows as stored (matmul.h's layout), with int8-quantized
// activations (quantize_q8_activations): the numbers gemv_w4_int8 computes from its interleaved
// copy on 32-column blocks, bit for bit, without that copy (8-bit parameters with cols a multiple
// of 128 take superblocks there, not here: gemv_w4_int8.h). For an INT4 output head (an image built with
// `--embedding int4`, whose tied head is the embedding): Gemma 4's 262,144 x 2,560 head would
// need a 335 MB copy, and a FlashHead image's stage 2 reads a few scattered clusters of rows.
//
// Per row r and token t, in block order b (32 columns; float32, fused multiply-add), as
// gemv_w4_int8.h states it:
//   D    = sum_{i in b} q_ri * xq_ti            (int32, exact)
//   acc  = fma(float(D), d_rg * d_tb, acc)      (acc, macc starting at 0; g the group of b)
//   macc = fma(m_rg, float(S_tb) * d_tb, macc)  (S_tb the block's sum of xq)
//   y    = acc + macc
// with d_rg, m_rg formed as there (8-bit parameters: d_row * s_g and -m_row * n_g, or d * -8 for
// symmetric groups, float32 products). AVX2 path (also taken on AVX512-VNNI CPUs): 8 rows at a
// time; per block each row's codes unpacked to bytes, `vpmaddubsw` against the activations, the
// 8 rows' 16-bit sums reduced by a `vphaddw` tree to one register (lane = row; at most 16
// products of 15 x 127 per 16-bit lane, < 2^15), so the float32 steps are the interleaved kernel's.
#pragma once

#include <cstddef>

#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/int8_isa.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::kernels {

/// True when `w` has a shape this kernel runs: kW4 with 16- or 8-bit group parameters and a
/// group size that is a positive multiple of 32 dividing cols (any row count).
bool w4_rows_supported(const Matrix& w);

/// y[(t - t_begin) * y_stride + r] for the tokens t in [t_begin, t_end) of `x` and the rows r in
/// [row_begin, row_end) of `w` (w.cols == x.cols), computed as the header says on the fastest
/// path this CPU has (AVX2 where best_int8_isa() is AVX2 or AVX512-VNNI, else portable). Each
/// 8-row pass takes every token before the next (its rows stay in L1). Throws kestrel::Error
/// unless w4_rows_supported(w), for column counts that differ, or ranges past the matrix or the
/// activations.
void gemv_w4_rows(const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end, float* y,
                  size_t y_stride, size_t row_begin, size_t row_end);

/// gemv_q8_rows for a kQ8_0 matrix, gemv_w4_rows for a kW4 one (a head marked
/// Matrix::int8_rows), with the same arguments; throws kestrel::Error for other types.
void gemv_int8_rows(const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end, float* y,
                    size_t y_stride, size_t row_begin, size_t row_end);

/// gemv_w4_rows on the path of `isa` (throws kestrel::Error where int8_isa_available(isa) is
/// false). For tests and benchmarks.
void gemv_w4_rows_on(Int8Isa isa, const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end,
                     float* y, size_t y_stride, size_t row_begin, size_t row_end);

}  // namespace kestrel::kernels
