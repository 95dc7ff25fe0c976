// compressed-tensors' pack-quantized layout (quant/compressed_tensors.h) and the integer zero
// points it needs (quant/w4.h): positions and values as the format defines them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/quant/compressed_tensors.h"
#include "kestrel/quant/w4.h"

namespace q = kestrel::quant;
namespace ct = kestrel::quant::ct;

namespace {

// Codes [rows, cols] (one per byte) in Kestrel's kW4 layout: per group, byte j holds code j
// (low nibble) and code j + G/2 (high nibble).
std::vector<uint8_t> to_kw4(const std::vector<uint8_t>& codes, size_t rows, size_t cols, size_t G) {
  std::vector<uint8_t> out(rows * cols / 2);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < cols / G; ++g) {
      for (size_t j = 0; j < G / 2; ++j) {
        const size_t c = r * cols + g * G + j;
        out[(r * cols + g * G) / 2 + j] = static_cast<uint8_t>(codes[c] | (codes[c + G / 2] << 4));
      }
    }
  }
  return out;
}

std::vector<uint8_t> random_codes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(rng() % 16);
  return v;
}

}  // namespace

TEST(CompressedTensors, EightConsecutiveColumnsFillOneWordLowNibbleFirst) {
  // Columns 0..7 of a row with codes 0..7 (signed -8..-1, stored +8): word 0x76543210.
  std::vector<uint8_t> codes(32, 0);
  for (size_t c = 0; c < 8; ++c) codes[c] = static_cast<uint8_t>(c);
  codes[8] = 15;
  const auto packed = ct::pack_weight(to_kw4(codes, 1, 32, 32), 1, 32, 32);
  ASSERT_EQ(packed.size(), 4u);
  EXPECT_EQ(static_cast<uint32_t>(packed[0]), 0x76543210u);
  EXPECT_EQ(static_cast<uint32_t>(packed[1]), 0x0000000Fu);
}

TEST(CompressedTensors, WeightPackingPutsColumnCInWordCOver8AtBits4TimesCMod8) {
  for (const size_t G : {32u, 64u, 128u}) {
    const size_t rows = 5, cols = 256;
    const auto codes = random_codes(rows * cols, static_cast<uint32_t>(G));
    const auto kw4 = to_kw4(codes, rows, cols, G);
    const auto packed = ct::pack_weight(kw4, rows, cols, G);
    ASSERT_EQ(packed.size(), rows * cols / 8);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = 0; c < cols; ++c) {
        const auto word = static_cast<uint32_t>(packed[r * cols / 8 + c / 8]);
        ASSERT_EQ((word >> (4 * (c % 8))) & 0xF, codes[r * cols + c]) << "G " << G << " r " << r << " c " << c;
      }
    }
    EXPECT_EQ(ct::unpack_weight(packed, rows, cols, G), kw4);
  }
}

TEST(CompressedTensors, ZeroPointsArePackedAlongTheRows) {
  const size_t rows = 13, n_groups = 3;  // a partial last word
  const auto z = random_codes(rows * n_groups, 7);
  const auto packed = ct::pack_zero_points(z, rows, n_groups);
  ASSERT_EQ(packed.size(), 2 * n_groups);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < n_groups; ++g) {
      const auto word = static_cast<uint32_t>(packed[(r / 8) * n_groups + g]);
      EXPECT_EQ((word >> (4 * (r % 8))) & 0xF, z[r * n_groups + g]);
    }
  }
  for (size_t g = 0; g < n_groups; ++g) EXPECT_EQ(static_cast<uint32_t>(packed[n_groups + g]) >> 20, 0u);
  EXPECT_EQ(ct::unpack_zero_points(packed, rows, n_groups), z);
}

TEST(CompressedTensors, BadSizesAreErrors) {
  std::vector<uint8_t> kw4(16);
  EXPECT_THROW(ct::pack_weight(kw4, 1, 64, 32), kestrel::Error);
  EXPECT_THROW(ct::pack_weight(kw4, 1, 32, 24), kestrel::Error);
  EXPECT_THROW(ct::unpack_zero_points(std::vector<int32_t>(3), 9, 2), kestrel::Error);
  EXPECT_THROW(ct::pack_zero_points(std::vector<uint8_t>{16}, 1, 1), kestrel::Error);
}

TEST(IntegerZeroPoints, MinimumIsScaleTimesZeroPoint) {
  const uint16_t d = kestrel::gguf::fp32_to_fp16(0.0123f);
  for (unsigned z = 0; z < 16; ++z) {
    const uint16_t m = q::integer_zero_point_min(d, z);
    ASSERT_EQ(q::integer_zero_point(d, m), z);
    const float dz = kestrel::gguf::fp16_to_fp32(d) * static_cast<float>(z);  // exact in float32
    EXPECT_LE(std::fabs(kestrel::gguf::fp16_to_fp32(m) + dz), dz * 0x1p-11f);  // half an fp16 ulp
  }
  // A free minimum between two zero points is not exact.
  const uint16_t m = kestrel::gguf::fp32_to_fp16(-kestrel::gguf::fp16_to_fp32(d) * 3.4f);
  EXPECT_FALSE(q::integer_zero_point(d, m).has_value());
  EXPECT_EQ(q::integer_zero_point(0, 0), 0u);
  EXPECT_FALSE(q::integer_zero_point(0, kestrel::gguf::fp32_to_fp16(0.5f)).has_value());
}

TEST(IntegerZeroPoints, FitIsExactAndCloseToTheFloatMinimum) {
  kestrel::ThreadPool pool(2);
  const size_t rows = 64, cols = 256;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(rows * cols);
  for (auto& x : w) x = dist(rng) + 0.3f;  // off-centre groups, where zero points matter
  for (const size_t G : {32u, 128u}) {
    const auto fl = q::quantize_w4(w.data(), rows, cols, G, nullptr, true, pool);
    const auto in = q::quantize_w4(w.data(), rows, cols, G, nullptr, true, pool, false, true);
    const auto sym = q::quantize_w4(w.data(), rows, cols, G, nullptr, false, pool);
    for (size_t i = 0; i < in.scales.size(); ++i) ASSERT_TRUE(q::integer_zero_point(in.scales[i], in.mins[i])) << i;
    size_t exact_float = 0;
    for (size_t i = 0; i < fl.scales.size(); ++i) exact_float += q::integer_zero_point(fl.scales[i], fl.mins[i]) ? 1 : 0;
    EXPECT_LT(exact_float, fl.scales.size() / 2);  // a free minimum is rarely an integer zero point
    const double e_fl = q::w4_rms_error(fl, w.data()), e_in = q::w4_rms_error(in, w.data()),
                 e_sym = q::w4_rms_error(sym, w.data());
    // Tying the grid to multiples of d costs the fit a degree of freedom: measured 1.10x (G 32)
    // the float minimum's RMS error on these Gaussian groups.
    std::printf("G %zu: RMS error float minimum %.5f, integer zero point %.5f (%.3fx), symmetric %.5f\n", G, e_fl,
                e_in, e_in / e_fl, e_sym);
    EXPECT_LT(e_in, 1.15 * e_fl) << "G " << G;
    EXPECT_LT(e_in, e_sym) << "G " << G;
  }
}
