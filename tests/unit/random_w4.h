// Test helper: a random INT4 (kW4) matrix in matmul.h's row-major layout, with each kind of
// group parameters, and activations with the int8 quantizer's edge cases.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/matmul.h"
#include "random_q8.h"

namespace kestrel::testing {

enum class Params { kSymmetric16, kAffine16, kAffine8, kSymmetric8 };

// A random kW4 matrix in the row-major layout of matmul.h, with the group parameters `p`.
struct RandomW4 {
  size_t rows, cols, group_size;
  Params p;
  std::vector<uint8_t> codes;
  std::vector<uint16_t> scales, mins, row_scales;
  std::vector<uint8_t> scales8, mins8;

  RandomW4(size_t r, size_t c, size_t g, Params params, uint64_t seed) : rows(r), cols(c), group_size(g), p(params) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255), u8(1, 255);
    std::uniform_real_distribution<float> scale(1e-3f, 2e-2f), row(1e-4f, 1e-3f);
    codes.resize(rows * cols / 2);
    for (auto& b : codes) b = static_cast<uint8_t>(byte(rng));
    const size_t n = rows * cols / group_size;
    if (p == Params::kSymmetric16 || p == Params::kAffine16) {
      for (size_t i = 0; i < n; ++i) scales.push_back(kestrel::gguf::fp32_to_fp16(scale(rng)));
      if (p == Params::kAffine16) {
        for (size_t i = 0; i < n; ++i) mins.push_back(kestrel::gguf::fp32_to_fp16(-8.0f * scale(rng)));
      }
    } else {
      for (size_t i = 0; i < n; ++i) scales8.push_back(static_cast<uint8_t>(u8(rng)));
      if (p == Params::kAffine8) {
        for (size_t i = 0; i < n; ++i) mins8.push_back(static_cast<uint8_t>(u8(rng)));
      }
      for (size_t i = 0; i < rows; ++i) {
        row_scales.push_back(kestrel::gguf::fp32_to_fp16(row(rng)));
        row_scales.push_back(kestrel::gguf::fp32_to_fp16(8.0f * row(rng)));
      }
    }
  }

  kernels::Matrix view() const {
    kernels::Matrix m;
    m.type = kernels::WeightType::kW4;
    m.data = codes.data();
    m.rows = rows;
    m.cols = cols;
    m.group_size = group_size;
    m.scales = scales.empty() ? nullptr : scales.data();
    m.mins = mins.empty() ? nullptr : mins.data();
    m.scales8 = scales8.empty() ? nullptr : scales8.data();
    m.mins8 = mins8.empty() ? nullptr : mins8.data();
    m.row_scales = row_scales.empty() ? nullptr : row_scales.data();
    return m;
  }

  int code(size_t r, size_t c) const {
    const size_t g = c / group_size, within = c % group_size, half = group_size / 2;
    const uint8_t b = codes[r * cols / 2 + g * half + within % half];
    return within >= half ? b >> 4 : b & 0x0F;
  }

  // The group's d and m as float32, formed as matmul.h defines them.
  void params(size_t r, size_t g, float& d, float& m) const {
    const size_t at = r * (cols / group_size) + g;
    if (!scales.empty()) {
      d = kestrel::gguf::fp16_to_fp32(scales[at]);
      m = mins.empty() ? -8.0f * d : kestrel::gguf::fp16_to_fp32(mins[at]);
      return;
    }
    d = kestrel::gguf::fp16_to_fp32(row_scales[2 * r]) * static_cast<float>(scales8[at]);
    m = mins8.empty() ? -8.0f * d : -kestrel::gguf::fp16_to_fp32(row_scales[2 * r + 1]) * static_cast<float>(mins8[at]);
  }
};

// Activations with a block of zeros, a block with one large outlier, a tiny block and a block of
// ties, per 32 columns; past 256 columns the same per 128 (the superblocks of gemv_w4_int8.h): a
// superblock of zeros, and one whose max is 127 with ties.
inline std::vector<float> activations(size_t n_tokens, size_t cols, uint64_t seed) {
  std::vector<float> x = kestrel::testing::edge_activations(n_tokens, cols, seed);
  for (size_t t = 0; t < n_tokens; ++t) {
    if (cols >= 96) {
      for (size_t i = 64; i < 96; ++i) x[t * cols + i] *= 1e-6f;
    }
    if (cols >= 128) {  // d_x = 1 exactly, and ties: x / d_x = k + 1/2 rounds to the even k
      x[t * cols + 96] = 127.0f;
      for (size_t i = 97; i < 128; ++i) x[t * cols + i] = static_cast<float>(static_cast<int>(i % 13) - 6) + 0.5f;
    }
    if (cols >= 256) {
      for (size_t i = 128; i < 256; ++i) x[t * cols + i] = 0.0f;
    }
    if (cols >= 384) {
      x[t * cols + 256] = 127.0f;
      for (size_t i = 257; i < 384; ++i) x[t * cols + i] = static_cast<float>(static_cast<int>(i % 13) - 6) + 0.5f;
    }
  }
  return x;
}

}  // namespace kestrel::testing
