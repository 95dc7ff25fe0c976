// GGUF tensors in the weight forms Kestrel's kernels run, converted at load (Precision::kAuto):
// a GGUF given with -m runs on the INT4 and Q8_0 kernels, not as float32.
//
// What each type becomes (docs/quantization.md, "A GGUF as it loads"):
//   Q4_0, Q4_1, Q4_K  INT4 groups of 32 (kernels::WeightType::kW4), the file's own 4-bit codes:
//                     Q4_0 symmetric, w = d (q - 8), and Q4_1 affine, w = d q + m, exactly
//                     (the same fp16 d and m); Q4_K affine per sub-block of 32, w = d_g q + m_g
//                     with d_g = fp16(d * sc) and m_g = fp16(-(dmin * m)) (ggml's
//                     dequantize_row_q4_K: y = d * sc * q - dmin * m): the products are exact in
//                     float32 and rounded once to fp16 (relative error <= 2^-11 of a group's step
//                     and minimum).
//   other quantized   Q8_0 (kernels::WeightType::kQ8_0): dequantized as ggml does, then per block
//   types             of 32 d = max|w| / 127, q = round(w / d) (ggml's quantize_row_q8_0_ref):
//                     |error| <= d / 2 per weight, ~1/8 of a Q6_K step.
//   Q8_0, BF16, F16,  as stored.
//   F32
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/quant/w4.h"

namespace kestrel::quant {

/// ggml Q8_0 of n float32 values (n a multiple of 32) into out (n / 32 * 34 bytes): per 32 values
/// an fp16 scale d = max|x| / 127 and int8 q = round(x / d) (ggml-quants.c quantize_row_q8_0_ref).
void quantize_q8_0(const float* x, size_t n, std::byte* out);

/// The kernel form a GGUF type converts to at load.
enum class KernelForm {
  kInPlace,  // Q8_0, BF16, F16, F32: used as stored
  kInt4,     // Q4_0, Q4_1, Q4_K: w4_from_gguf
  kQ8_0,     // every other quantized type: q8_0_from_gguf
};
/// The form for a [rows, cols] tensor of `type`. A type that needs rows of a multiple of 32 for
/// its form and has other rows (never a valid quantized tensor) gets kInPlace's float32 fallback
/// from the caller. Throws kestrel::Error for a type Kestrel cannot read.
KernelForm kernel_form(gguf::TensorType type);

/// The INT4 matrix (group size 32) holding the 4-bit codes of `data`, a [rows, cols] tensor of
/// type Q4_0, Q4_1 or Q4_K (rows of gguf::row_bytes(type, cols) bytes), converted as the header
/// says. Throws kestrel::Error for another type, a size that does not match, or a Q4_K
/// parameter that overflows fp16 (|d * sc| or |dmin * m| above 65504).
W4Matrix w4_from_gguf(gguf::TensorType type, std::span<const std::byte> data, size_t rows, size_t cols,
                      ThreadPool& pool);

/// Q8_0 bytes (rows * cols / 32 * 34) of a [rows, cols] tensor of any readable type, cols a
/// multiple of 32: dequantized to float32 (gguf::dequantize) and quantized by quantize_q8_0, a
/// row at a time. Throws kestrel::Error for a size that does not match or cols not a multiple of 32.
std::vector<std::byte> q8_0_from_gguf(gguf::TensorType type, std::span<const std::byte> data, size_t rows,
                                      size_t cols, ThreadPool& pool);

}  // namespace kestrel::quant
