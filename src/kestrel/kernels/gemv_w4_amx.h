// AMX-INT8 tiles for the prefill chunks of gemv_w4_int8 (Int8Isa::kAmx, int8_isa.h): the same
// formulas as its AVX512-VNNI path, and the same bits.
//
// A token tile is 8 tokens; per 16-row block of weights and per 32 columns (the 32-column
// formula) or group (the superblock formula, gemv_w4_int8.h) one `tdpbsud` computes the 8 x 16
// exact int32 dot products D of the int8 activations (tile A: 8 token rows of the call's
// quantized activations, read in place with the row stride cols) with the 4-bit codes (tile B:
// 16 rows x 4 columns per 64-byte tile row, which is the interleaved layout's 32-bit lane
// order, so a block's codes only need their nibbles split: low nibbles of octet o give tile row
// 2o, high nibbles row 2o + 1). The tile's rows are tokens and its 16 lanes the block's rows, as
// in a VNNI register, so the float32 steps after each D are the VNNI path's, in the same order:
// the integers are exact and the float32 operations identical, hence the same bits for every
// token (the tests compare every path with the portable one).
//
// Tiles: tmm0 the int32 sums (8 x 64 bytes), tmm1 the activations (8 x K bytes), tmm2 the codes
// (K / 4 x 64 bytes), K = 32, or min(G, 64) for groups of G columns on superblocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/int8_super_activations.h"

namespace kestrel::kernels {

inline constexpr size_t kAmxTokens = 8;  // tokens per tile (rows of tiles A and C)

/// The 32-column formula (gemv_w4_int8.h) for tokens [0, n_tokens) (a multiple of kAmxTokens)
/// and rows [row_begin, row_end): xq [n_tokens][il.cols] int8 activations, xd and xs
/// [n_tokens][il.cols / 32] d_xb and float(S_b) * d_xb; y[t * y_stride + r]. Needs
/// int8_isa_available(Int8Isa::kAmx) (the caller's to check: elsewhere the first tile
/// instruction faults).
void w4_blocks_amx(const W4Int8Interleaved& il, const int8_t* xq, const float* xd, const float* xs, size_t n_tokens,
                   float* y, size_t y_stride, size_t row_begin, size_t row_end);

/// The superblock formula (gemv_w4_int8.h, "Superblocks") for tokens [0, n_tokens) (a multiple
/// of kAmxTokens) of `a`, quantized with G = il.group_size; otherwise as w4_blocks_amx.
void w4_super_amx(const W4Int8Interleaved& il, const SuperActivations& a, size_t n_tokens, float* y, size_t y_stride,
                  size_t row_begin, size_t row_end);

}  // namespace kestrel::kernels
