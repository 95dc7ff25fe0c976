// compressed-tensors' "pack-quantized" INT4 layout (the W4A16 format vLLM, SGLang and
// transformers load), converted to and from Kestrel's INT4 layout (kernels/matmul.h, kW4).
//
// compressed-tensors stores, per Linear of [rows = out_features, cols = in_features]:
//  - weight_packed: int32 [rows, cols / 8]; column c of a row sits in word c / 8 at bits
//    4 * (c % 8) (least significant first), as the unsigned value v + 8 of the signed code
//    v in [-8, 7];
//  - weight_scale: [rows, cols / group_size], the group's scale s;
//  - weight_zero_point (asymmetric only): int32 [ceil(rows / 8), cols / group_size], packed
//    along the rows: row r's zero point z in word r / 8 at bits 4 * (r % 8), stored as z + 8;
//  - weight_shape: int64 [2] = {rows, cols}.
// It dequantizes w = (v - z) * s. Kestrel's code q in 0..15 is v + 8, and its integer zero
// point (quant/w4.h, integer_zero_point) is z + 8, so both nibble values are the same numbers
// in the two layouts: only their positions differ. Kestrel groups of `group_size` hold, in byte
// j, weight j in the low nibble and weight j + group_size / 2 in the high one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kestrel::quant::ct {

/// Kestrel INT4 codes (`q4`: rows * cols / 2 bytes, the kW4 layout with `group_size`) as
/// weight_packed words, row-major [rows, cols / 8]. Throws kestrel::Error unless group_size is
/// even, divides cols, and q4 has rows * cols / 2 bytes.
std::vector<int32_t> pack_weight(std::span<const uint8_t> q4, size_t rows, size_t cols, size_t group_size);

/// The inverse of pack_weight: weight_packed [rows, cols / 8] to kW4 bytes. Throws
/// kestrel::Error when the sizes disagree.
std::vector<uint8_t> unpack_weight(std::span<const int32_t> packed, size_t rows, size_t cols, size_t group_size);

/// Zero points (`z`: rows * n_groups values in 0..15, row-major, the unsigned form z + 8 of the
/// signed zero point) as weight_zero_point words, row-major [ceil(rows / 8), n_groups]; the
/// nibbles of a last partial word past `rows` are 0. Throws kestrel::Error for a value > 15 or
/// a size mismatch.
std::vector<int32_t> pack_zero_points(std::span<const uint8_t> z, size_t rows, size_t n_groups);

/// The inverse of pack_zero_points: rows * n_groups values in 0..15. Throws kestrel::Error
/// when the sizes disagree.
std::vector<uint8_t> unpack_zero_points(std::span<const int32_t> packed, size_t rows, size_t n_groups);

}  // namespace kestrel::quant::ct
