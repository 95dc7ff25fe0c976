#include "kestrel/quant/w4.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"

namespace kestrel::quant {
namespace {

constexpr float kDivisors[] = {-8.0f, -7.75f, -7.5f, -7.25f, -7.0f, -6.75f, -6.5f,
                               6.5f,  6.75f,  7.0f,  7.25f,  7.5f};

uint8_t quantize_one(float w, float inv_d) {
  const float q = std::nearbyint(w * inv_d) + 8.0f;
  return static_cast<uint8_t>(std::clamp(q, 0.0f, 15.0f));
}

// Quantizes one group; returns the fp16 scale and writes group_size / 2 packed bytes.
uint16_t quantize_group(const float* w, const float* importance, size_t n, uint8_t* out) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(w[i]) > std::fabs(m)) m = w[i];
  }
  uint16_t best_bits = 0;
  double best_err = INFINITY;
  for (float c : kDivisors) {
    const uint16_t bits = gguf::fp32_to_fp16(m / c);
    const float d = gguf::fp16_to_fp32(bits);  // quantize against the scale actually stored
    const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
    double err = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const float deq = d * static_cast<float>(quantize_one(w[i], inv_d) - 8);
      const double e = static_cast<double>(w[i] - deq);
      err += (importance ? importance[i] : 1.0f) * e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_bits = bits;
    }
  }
  const float d = gguf::fp16_to_fp32(best_bits);
  const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
  const size_t half = n / 2;
  for (size_t j = 0; j < half; ++j) {
    out[j] = static_cast<uint8_t>(quantize_one(w[j], inv_d) | (quantize_one(w[j + half], inv_d) << 4));
  }
  return best_bits;
}

}  // namespace

kernels::Matrix W4Matrix::view() const {
  kernels::Matrix m;
  m.type = kernels::WeightType::kW4;
  m.data = qs.data();
  m.rows = rows;
  m.cols = cols;
  m.scales = scales.data();
  m.group_size = group_size;
  return m;
}

W4Matrix quantize_w4(const float* w, size_t rows, size_t cols, size_t group_size,
                     const float* importance, ThreadPool& pool) {
  if (group_size == 0 || group_size % 32 != 0 || cols % group_size != 0) {
    throw Error("INT4 group size " + std::to_string(group_size) +
                " must be a multiple of 32 that divides the row length " + std::to_string(cols));
  }
  W4Matrix q;
  q.rows = rows;
  q.cols = cols;
  q.group_size = group_size;
  q.qs.resize(rows * cols / 2);
  const size_t n_groups = cols / group_size;
  q.scales.resize(rows * n_groups);
  pool.parallel_for(rows, 8, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      for (size_t g = 0; g < n_groups; ++g) {
        const size_t col = g * group_size;
        q.scales[r * n_groups + g] =
            quantize_group(w + r * cols + col, importance ? importance + col : nullptr, group_size,
                           &q.qs[(r * cols + col) / 2]);
      }
    }
  });
  return q;
}

double w4_rms_error(const W4Matrix& q, const float* w) {
  std::vector<float> row(q.cols);
  const kernels::Matrix m = q.view();
  double sum = 0.0;
  for (size_t r = 0; r < q.rows; ++r) {
    kernels::matrix_row(m, r, row.data());
    for (size_t i = 0; i < q.cols; ++i) {
      const double e = static_cast<double>(row[i]) - w[r * q.cols + i];
      sum += e * e;
    }
  }
  return std::sqrt(sum / static_cast<double>(q.rows * q.cols));
}

}  // namespace kestrel::quant
