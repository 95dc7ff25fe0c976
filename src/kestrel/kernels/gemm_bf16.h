// Prefill GEMM with bfloat16 dot products (x86 AVX512-BF16: vdpbf16ps, 32 multiply-adds per
// instruction, float32 accumulation), for CPUs that have it (Zen 4, Sapphire Rapids, Cooper Lake).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kestrel::kernels {

/// True when this CPU executes AVX512-BF16 and KESTREL_NO_BF16_DOT is not set (for A/B runs).
bool bf16_dot_available();

/// y[t, row0 + r] = sum_i w[r, i] * x[t, i] with w [n_rows, cols] and x [n_tokens, x_stride]
/// bfloat16 (row-major), float32 accumulation. cols must be a multiple of 32 and
/// bf16_dot_available() true; both are the caller's to check.
void gemm_bf16_block(const uint16_t* w, size_t n_rows, size_t cols, const uint16_t* x,
                     size_t n_tokens, size_t x_stride, float* y, size_t y_stride, size_t row0);

/// float32 -> bfloat16 with round-to-nearest-even, n elements.
void to_bf16(const float* in, uint16_t* out, size_t n);

}  // namespace kestrel::kernels
