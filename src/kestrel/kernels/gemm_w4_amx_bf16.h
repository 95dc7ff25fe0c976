// Prefill products of INT4 matrices on AMX-BF16 tiles (Sapphire Rapids and later): bfloat16
// weights and activations, float32 accumulation, 16 tokens x 16 rows x 32 columns per
// `tdpbf16ps` (512 multiply-adds per cycle and core, against 64 for AVX512-VNNI's `vpdpbusd`
// on int8).
//
// Numbers: the weights are those of the bf16 prefill tiles (matmul.cpp): w = fma(q, d, m) in
// float32 from the 4-bit code q and its group's d, m (16-bit parameters; 8-bit: d = d_row * s_g,
// m = -(m_row * n_g), or -8 d), rounded to bfloat16 to nearest even; the activations are rounded
// to bfloat16 the same way; every product of two bfloat16 is exact in float32, and the tile adds
// them in float32 (Intel SDM, TDPBF16PS: denormal inputs and results flushed to zero). So against
// float64 sum_c bf16(w_rc) bf16(x_tc): |y - ref| <= cols * 2^-24 * sum_c |bf16(w_rc) bf16(x_tc)|
// (tests/unit/test_w4_amx_bf16.cpp). A token's result does not depend on the tokens computed
// with it, the row range or the thread split (each sum runs over the columns in order). Against
// the int8-activation products (gemv_w4_int8.h) the activations round 2^-9 instead of to 8 bits
// per block: more accurate.
//
// Layout: per 16-row block of the int8 copy (W4Int8Interleaved: its codes and group parameters
// are read, nothing else is stored), the weights are dequantized once per call into tile-B rows,
// one per column pair: 64 bytes, 32-bit lane i = row i's (w[2p], w[2p+1]); the tokens' bf16 rows
// are tile A (16 tokens x 32 columns, read in place). Two row blocks and two token tiles share
// each step (4 accumulator tiles).
#pragma once

#include <cstddef>

#include "kestrel/kernels/gemv_w4_int8.h"

namespace kestrel::kernels {

/// matmul takes the tiles, where amx_prefill_enabled(), for products of kTileMinTokens tokens
/// or more (the whole product's count, however the threads split it: matmul.h), the boundary
/// the scheduler and the decoder keep for prefill rows, so that batching does not change a row's
/// bits; fewer (decode rows, speculative verification, short prompt tails) keep the int8
/// kernels. Short products pay the dequantization of every row block for few tokens: one
/// thread, 2048 x 640, against AVX512-VNNI's int8 kernel, 16 tokens ~0.6x, 32 ~1.05x, 64 1.7x,
/// 256 3x (docs/quantization.md).

/// Whether the AMX-BF16 tiles run here: AMX-TILE and AMX-BF16, AVX512-BF16 (for the
/// conversions), the OS's tile state and Linux's permission for it (int8_isa.h,
/// amx_tiles_granted). Read once.
bool amx_bf16_available();

/// Whether matmul takes the tiles for prefill: amx_bf16_available() and KESTREL_AMX=1 (opt-in:
/// the prefill's bf16 rounding moves the default model's greedy FlashHead-vs-dense agreement on
/// its 20 test prompts from 18 to 17, under the bar of 18; docs/quantization.md). Read once.
bool amx_prefill_enabled();

/// y[t * y_stride + r] for t < n_tokens (any count >= 1) and r in [row_begin, row_end): the
/// header's product of il's weights with x[t * x_stride + c] (float32). Throws kestrel::Error
/// where amx_bf16_available() is false or the rows run past the matrix.
void gemm_w4_amx_bf16(const W4Int8Interleaved& il, const float* x, size_t n_tokens, size_t x_stride, float* y,
                      size_t y_stride, size_t row_begin, size_t row_end);

}  // namespace kestrel::kernels
