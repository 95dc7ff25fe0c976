// Block layouts of ggml tensor types and their dequantization to float32.
//
// Formulas: ggml's ggml-quants.c (dequantize_row_*) and ggml-common.h (block structs);
// checked against gguf-py's gguf/quants.py in tests/unit/test_dequant.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kestrel/formats/gguf.h"

namespace kestrel::gguf {

/// Name as ggml prints it, e.g. "Q4_K".
const char* tensor_type_name(TensorType type);
/// True when Kestrel can dequantize the type.
bool is_supported(TensorType type);
/// Elements per block (1 for plain types, 32 for Q*_0, 256 for K-quants). Throws GgufError
/// kUnknownTensorType for unsupported types.
size_t block_elements(TensorType type);
/// Bytes per block.
size_t block_bytes(TensorType type);
/// Bytes of a row of `n` elements (n must be a multiple of block_elements; else kBadShape).
uint64_t row_bytes(TensorType type, uint64_t n);

/// Dequantizes `n` consecutive elements (a multiple of block_elements(type)) from `src` into `dst`.
/// Throws GgufError kUnknownTensorType / kBadShape.
void dequantize(TensorType type, const void* src, float* dst, size_t n);

/// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K
/// super-block, from its 12 packed scale bytes.
void k_quant_scale_min(const uint8_t* scales, size_t j, int* scale, int* min);

/// IEEE half and bfloat16 conversions (round to nearest even on narrowing).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

}  // namespace kestrel::gguf
