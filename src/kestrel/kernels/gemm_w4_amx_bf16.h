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

/// Products of at least this many tokens (the whole product's count, however the threads split
/// it) take the tiles in matmul; fewer (decode rows, speculative verification, batched decode of
/// several sessions, short prompts) keep the int8 kernels, whose bits do not depend on the token
/// count. Measured on a 2-core Xeon with AMX, 2048 x 640, one thread, tokens per call: 8: 64
/// GMAC/s against AVX512-VNNI's 196, 16: 127 / 199, 32: 209 / 200, 64: 323 / 194 (each call
/// dequantizes its row blocks once, so short calls pay it for few tokens).
inline constexpr size_t kAmxMinTokens = 64;

/// Whether the AMX-BF16 tiles run here: AMX-TILE and AMX-BF16, AVX512-BF16 (for the
/// conversions), the OS's tile state and Linux's permission for it (int8_isa.h, kAmx), and
/// KESTREL_NO_AMX not set. Read once.
bool amx_bf16_available();

/// y[t * y_stride + r] for t < n_tokens (any count >= 1) and r in [row_begin, row_end): the
/// header's product of il's weights with x[t * x_stride + c] (float32). Throws kestrel::Error
/// where amx_bf16_available() is false or the rows run past the matrix.
void gemm_w4_amx_bf16(const W4Int8Interleaved& il, const float* x, size_t n_tokens, size_t x_stride, float* y,
                      size_t y_stride, size_t row_begin, size_t row_end);

}  // namespace kestrel::kernels
