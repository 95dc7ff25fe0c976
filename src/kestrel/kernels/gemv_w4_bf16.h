// Decode GEMV for INT4 (kW4) matrices with bfloat16 dot products (x86 AVX512-BF16 `vdpbf16ps`).
//
// The nibbles are never converted to float: a 4-bit code q becomes the bfloat16 bit pattern
// 0x4300 | q, which is exactly the number 128 + q, by interleaving the code bytes with the byte
// 0x43 (one `vpunpck[lh]bw`). The dot product of 32 such values with 32 bf16 activations is one
// `vdpbf16ps` (float32 accumulation), and the 128 * sum(x) that the bias adds is removed through
// per-group sums of the activations:
//   sum_i w_i x_i = sum_g [ d_g * sum_{i in g} (128 + q_i) x_i + (m_g - 128 d_g) * sum_{i in g} x_i ]
// for affine groups (w = d q + m), and the same with m_g = -8 d_g for symmetric groups
// (w = d (q - 8)). Activations are rounded to bfloat16 (16-bit activations, as W4A16 means);
// the products and every sum are float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kestrel/kernels/matmul.h"

namespace kestrel::kernels {

/// One token's activations, prepared once per matrix shape for gemv_w4_bf16.
struct W4GemvInput {
  size_t cols = 0;
  size_t group_size = 0;
  std::vector<uint16_t> x;          // bf16 [cols], permuted into the kernel's nibble order
  std::vector<float> group_sums;    // float32 [cols / group_size]: sum of the bf16-rounded x per group
};

/// True when gemv_w4_bf16 can run `w`: kW4, the CPU has AVX512-BF16 (bf16_dot_available()),
/// cols a multiple of 128, and group_size dividing 128 or a multiple of it.
bool gemv_w4_bf16_supported(const Matrix& w);

/// Prepares `x` (float32 [cols]) for matrices of this cols and group_size (reuses `out`'s storage).
void prepare_w4_gemv(const float* x, size_t cols, size_t group_size, W4GemvInput& out);

/// y[r] = sum_i W[r, i] * x[i] for r in [row_begin, row_end), W a kW4 matrix for which
/// gemv_w4_bf16_supported() holds and `in` prepared for its cols and group_size (the caller's
/// to check). Error against the float64 product of the dequantized weights and the
/// bf16-rounded activations: float32 rounding only (~1e-6 relative to sum |w_i x_i|).
void gemv_w4_bf16(const Matrix& w, const W4GemvInput& in, float* y, size_t row_begin, size_t row_end);

/// gemv_w4_bf16 of n_tokens tokens: y[t * y_stride + r] for t < n_tokens, in[t] prepared from
/// token t. A row's codes are read once for all the tokens and unpacked once per eight of them;
/// each y is bit-identical to gemv_w4_bf16's.
void gemv_w4_bf16_tokens(const Matrix& w, const W4GemvInput* in, size_t n_tokens, float* y, size_t y_stride,
                         size_t row_begin, size_t row_end);

}  // namespace kestrel::kernels
