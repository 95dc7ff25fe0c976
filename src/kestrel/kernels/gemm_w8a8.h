// Prefill products of INT4 matrices with 8-bit group parameters through an int8 copy of their
// weights (W8A8), opt-in (KESTREL_W8A8=1): int8 weights x int8 activations, one integer dot
// product per superblock of 128 columns and one float32 step, where the INT4 superblock kernel
// (gemv_w4_int8.h) spends an integer multiply per group and the minimums' products per
// superblock: E4B-shaped prefill +11-17 % on the Zen 4 EPYC (docs/benchmarks.md, session 23).
// The copy holds a byte per weight (the INT4 copy half of one), so a load holds both: the INT4
// copy for decode (a bandwidth limit: half the bytes) and this one for chunks of kTileMinTokens
// tokens or more (a compute limit).
// Not the default: rounding the weights again costs accuracy. On the default model built with
// --scale-bits 8, KL against bf16 activations 0.00316 -> 0.00529 and perplexity +0.18 % ->
// +0.62 %, past llama.cpp's own 8-bit activation rounding (0.00473, +0.42 %), issue #19's bar
// for a default. Finer steps per superblock or per group (a power-of-two exponent each) measured
// 0.00499 and 0.00433, and per group as slow as the INT4 kernel (docs/quantization.md).
//
// Weights: row r's INT4 values w_rc (matrix_row: the image's numbers) rounded again to int8 with
// one float32 scale per row,
//   R_r = max_c |w_rc| / 127,  v_rc = round-to-nearest-even(w_rc / R_r) in [-127, 127]
// (0 where R_r = 0). The rounding adds at most R_r / 2 per weight; one step for the whole row is
// coarse next to the INT4 steps of a row's narrow groups.
// Activations: int8_super_activations.h with S_k the sum of superblock k's values. Per row r
// and token, in superblock order k (float32; fma rounds once):
//   D_k = sum_{c in k} v_rc * xq_c            (int32, exact: |D_k| <= 127 * 127 * 128)
//   acc = fma(float(D_k), d_xk, acc)          (acc starting at 0)
//   y   = R_r * acc
// The integers are exact and the float32 steps the same on every path (AVX512-VNNI vpdpbusd of
// v + 128 against xq, less 128 S_k; AVX2 vpmaddubsw of |v| against sign(v) xq; portable), so all
// give the same bits, for any token count, row range or chunking of the columns.
//
// Layout: rows interleaved in blocks of 16; per block, per 4 columns ("quad") 64 bytes, 32-bit
// lane i holding row i's 4 values as v + 128 (unsigned: vpdpbusd's first operand).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kestrel/base/thread_pool.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/int8_isa.h"
#include "kestrel/kernels/int8_super_activations.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::kernels {

/// Whether loads build the W8A8 copy where it applies (w4_int8_superblocks): KESTREL_W8A8 when
/// set ("0": no, "1": yes, anything else throws kestrel::Error), else no. Read once.
bool w8a8_default();

/// Fills il.w8 and il.w8_scale from `w` (the matrix `il` was interleaved from; kW4 with 8-bit
/// group parameters, rows a multiple of 16, cols of 128): the header's v + 128 and R_r, in a
/// storage of its own that becomes il.owned (keeping the one il had: W4Int8Storage::previous). Blocks
/// of 16 rows split over `pool`'s threads when one is given. Throws kestrel::Error for other
/// shapes.
void requantize_w8(const Matrix& w, W4Int8Interleaved& il, ThreadPool* pool = nullptr);

/// y[t * y_stride + r] for t < n_tokens, r in [row_begin, row_end): the header's formula from
/// il.w8 (not empty) and the activations `a` (quantized with G = 128: one sum per superblock),
/// on the path of `isa` (available: int8_isa_available).
void gemm_w8a8_on(Int8Isa isa, const W4Int8Interleaved& il, const SuperActivations& a, size_t n_tokens, float* y,
                  size_t y_stride, size_t row_begin, size_t row_end);

}  // namespace kestrel::kernels
