// Test helper: a Q8_0 matrix of random codes and fp16 scales, as GGUF stores it.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kestrel/formats/dequant.h"

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

}  // namespace kestrel::testing
