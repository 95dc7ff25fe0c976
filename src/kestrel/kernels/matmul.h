// Matrix products of weight matrices with float32 activations.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kestrel/base/thread_pool.h"

namespace kestrel::kernels {

/// Storage of a weight matrix's rows.
enum class WeightType {
  kF32,   // row-major float32
  kQ8_0,  // ggml Q8_0 blocks: per 32 weights, an fp16 scale d and 32 int8 q; w = d * q
};

/// A weight matrix W of shape [rows, cols] (each row holds the `cols` input weights of one
/// output), as stored by GGUF (ggml ne = {cols, rows}). Non-owning.
struct Matrix {
  WeightType type = WeightType::kF32;
  const void* data = nullptr;
  size_t rows = 0;
  size_t cols = 0;
  size_t row_bytes() const;
  const uint8_t* row(size_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes(); }
};

/// y[t, r] = sum_i W[r, i] * x[t, i] for t < n_tokens, r < W.rows.
/// x: float32 [n_tokens, x_stride], y: float32 [n_tokens, y_stride] (strides in elements).
/// Rows are split over the pool. For kQ8_0, cols must be a multiple of 32.
/// Accumulation is float32 (W4A16 issue: activations never go below 16 bits).
void matmul(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
            size_t y_stride, ThreadPool& pool);

/// Row r of W as float32 [cols] (dequantized for kQ8_0).
void matrix_row(const Matrix& w, size_t r, float* out);

/// Scalar reference of matmul for tests (float64 accumulation).
void matmul_reference(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
                      size_t y_stride);

}  // namespace kestrel::kernels
