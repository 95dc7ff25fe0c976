// Products of a Q8_0 matrix, its rows as stored (ggml blocks of 32: an fp16 scale and 32 int8
// codes), with int8-quantized activations (quantize_q8_activations): the numbers
// gemv_q8_interleaved computes from its interleaved copy, bit for bit, without that copy. For a
// FlashHead image's head (head/flashhead.h): stage 2 scores a few scattered clusters of rows per
// token, and the dense head is seldom run, so the ~190 MB interleaved copy of Gemma 3's head
// would cost more memory than it saves time.
//
// Per row r and token t, in block order b (float32, fused multiply-add), as gemv_q8_interleaved.h
// states it:
//   y = fma(float(sum_{i in b} w_ri * q_ti), s_rb * d_tb, y),   y starting at 0,
// the integer sums exact. AVX2 path (also taken on AVX512-VNNI CPUs for fewer than 8 tokens): 8
// rows at a time, every token against them while they sit in L1, each block's 8 integer sums
// reduced into one register (lane = row) so that the float32 steps are the interleaved kernel's;
// `vpmaddubsw` takes |w| against sign(q, w), as there. AVX512-VNNI with 8 tokens or more (the
// dense head of prompt scoring and perplexity, in chunks of 64 tokens): 16 rows at a time are
// copied to the interleaved layout (an AVX-512 transpose, ~0.7 us) and run on
// gemv_q8_interleaved's vpdpbusd tiles, whose per-token cost is a quarter of the horizontal
// sums' (gemv_q8_rows_block16_vnni).
#pragma once

#include <cstddef>
#include <span>

#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/int8_isa.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::kernels {

/// y[(t - t_begin) * y_stride + r] for the tokens t in [t_begin, t_end) of `x` and the rows r in
/// [row_begin, row_end) of `w` (kQ8_0, w.cols == x.cols), computed as the header says on the
/// fastest path this CPU has (AVX512-VNNI tiles from 8 tokens, AVX2 where best_int8_isa() is AVX2
/// or AVX512-VNNI, else portable); every path writes the same bits.
/// Throws kestrel::Error for a matrix that is not Q8_0, column counts that differ, or ranges past
/// the matrix or the activations.
void gemv_q8_rows(const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end, float* y,
                  size_t y_stride, size_t row_begin, size_t row_end);

/// gemv_q8_rows on the path of `isa` (throws kestrel::Error where int8_isa_available(isa) is
/// false). For tests and benchmarks.
void gemv_q8_rows_on(Int8Isa isa, const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end,
                     float* y, size_t y_stride, size_t row_begin, size_t row_end);

/// The most tokens gemv_q8_rows_tokens takes in one call.
inline constexpr size_t kRowsTokensMax = 4;

/// gemv_q8_rows for tokens listed by index instead of a range: ys[i][r - row_begin] for the
/// token tokens[i] of `x` (any order, repeats allowed) and r in [row_begin, row_end), the same
/// bits gemv_q8_rows writes for that token and row. For FlashHead's stage 2, where the rows of
/// a step probing one cluster are scattered tokens of the batch: the cluster's 8-row blocks and
/// their block scales are read once for all of them (AVX2 path). 1 to kRowsTokensMax tokens;
/// throws kestrel::Error otherwise, and as gemv_q8_rows does.
void gemv_q8_rows_tokens(const Matrix& w, const Q8Activations& x, std::span<const size_t> tokens,
                         std::span<float* const> ys, size_t row_begin, size_t row_end);

/// gemv_q8_rows_tokens on the path of `isa` (AVX2, also taken for AVX512-VNNI, or portable).
void gemv_q8_rows_tokens_on(Int8Isa isa, const Matrix& w, const Q8Activations& x, std::span<const size_t> tokens,
                            std::span<float* const> ys, size_t row_begin, size_t row_end);

}  // namespace kestrel::kernels
