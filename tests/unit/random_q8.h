// Test helper: a Q8_0 matrix of random codes and fp16 scales, as GGUF stores it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::testing {

// A Q8_0 matrix of random codes (-128..127) and random positive fp16 scales.
inline std::vector<uint8_t> random_q8_0(size_t rows, size_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> code(-128, 127);  // -128: the edge of the AVX2 path's |w|
  std::uniform_real_distribution<float> scale(1e-3f, 2e-2f);
  std::vector<uint8_t> bytes(rows * cols / 32 * 34);
  for (size_t b = 0; b < rows * cols / 32; ++b) {
    const uint16_t h = gguf::fp32_to_fp16(scale(rng));
    std::memcpy(&bytes[b * 34], &h, 2);
    for (size_t i = 0; i < 32; ++i) bytes[b * 34 + 2 + i] = static_cast<uint8_t>(static_cast<int8_t>(code(rng)));
  }
  return bytes;
}

// A non-owning kQ8_0 view of `bytes` (random_q8_0's layout).
inline kernels::Matrix q8_0_view(const std::vector<uint8_t>& bytes, size_t rows, size_t cols) {
  kernels::Matrix m;
  m.type = kernels::WeightType::kQ8_0;
  m.data = bytes.data();
  m.rows = rows;
  m.cols = cols;
  return m;
}

// Gaussian activations [n_tokens, cols] with, per token, a block of zeros (columns 0-31) and a
// block with one large outlier (column 40): the int8 quantizer's edge cases.
inline std::vector<float> edge_activations(size_t n_tokens, size_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> x(n_tokens * cols);
  for (auto& v : x) v = g(rng);
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t i = 0; i < 32; ++i) x[t * cols + i] = 0.0f;
    if (cols >= 64) x[t * cols + 40] = 300.0f;
  }
  return x;
}

// float64 sum of gemv_q8_interleaved.h's formula, sum_b (sum_i w_ri q_ti) * s_rb * d_tb, for row r
// of the Q8_0 matrix m and token t of xq; *magnitude gets sum_b |term| (the scale of its rounding).
inline double q8_0_reference(const kernels::Matrix& m, const kernels::Q8Activations& xq, size_t t, size_t r,
                             double* magnitude) {
  const size_t nb = m.cols / 32;
  double ref = 0, mag = 0;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* blk = m.row(r) + b * 34;
    uint16_t h = 0;
    std::memcpy(&h, blk, 2);
    int64_t dot = 0;
    for (size_t i = 0; i < 32; ++i) dot += static_cast<int8_t>(blk[2 + i]) * xq.q[t * m.cols + b * 32 + i];
    const double term = static_cast<double>(dot) * gguf::fp16_to_fp32(h) * xq.scale[t * nb + b];
    ref += term;
    mag += std::fabs(term);
  }
  *magnitude = mag;
  return ref;
}

}  // namespace kestrel::testing
