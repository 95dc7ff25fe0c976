// Dequantization against gguf-py (tests/goldens/dequant.json, made by
// scripts/goldens/make_dequant_goldens.py from the default model and crafted blocks).
// Every comparison is bitwise: Kestrel performs the same float32 operations in the same order
// as ggml and gguf-py, so the results must be identical, not merely close.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kestrel/formats/dequant.h"
#include "source_dir.h"

namespace kestrel::gguf {
namespace {

const nlohmann::json& goldens() {
  static const nlohmann::json json = [] {
    std::ifstream in(::kestrel::testing::source_dir() / "tests/goldens/dequant.json");
    EXPECT_TRUE(in.good()) << "missing tests/goldens/dequant.json";
    return in.good() ? nlohmann::json::parse(in) : nlohmann::json::object();
  }();
  return json;
}

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> bytes(hex.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return bytes;
}

TEST(DequantTest, MatchesGgufPyBitwise) {
  const nlohmann::json& cases = goldens().at("cases");
  ASSERT_GE(cases.size(), 10u);
  std::map<std::string, int> checked_types;
  for (const nlohmann::json& c : cases) {
    SCOPED_TRACE(c.at("name").get<std::string>() + " (" + c.at("source").get<std::string>() + ")");
    const auto type = static_cast<TensorType>(c.at("type_id").get<uint32_t>());
    EXPECT_STREQ(tensor_type_name(type), c.at("type").get<std::string>().c_str());
    const std::vector<uint8_t> bytes = from_hex(c.at("bytes").get<std::string>());
    const auto n = c.at("n").get<size_t>();
    ASSERT_EQ(bytes.size(), n / block_elements(type) * block_bytes(type));
    ASSERT_TRUE(is_supported(type));

    std::vector<float> values(n);
    dequantize(type, bytes.data(), values.data(), n);
    const auto expected = c.at("values").get<std::vector<uint32_t>>();
    ASSERT_EQ(expected.size(), n);
    int mismatches = 0;
    for (size_t i = 0; i < n && mismatches < 5; ++i) {
      const uint32_t got = std::bit_cast<uint32_t>(values[i]);
      if (got != expected[i]) {
        ++mismatches;
        ADD_FAILURE() << "element " << i << ": got " << values[i] << " (0x" << std::hex << got
                      << "), gguf-py " << std::bit_cast<float>(expected[i]) << " (0x" << expected[i]
                      << ")";
      }
    }
    ++checked_types[c.at("type").get<std::string>()];
  }
  // The types of the default model must be covered by real blocks.
  for (const char* type : {"F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}) {
    EXPECT_GE(checked_types[type], 2) << type;
  }
  for (const char* type : {"F16", "BF16", "Q4_0", "Q4_1", "Q5_1", "Q2_K", "Q3_K", "Q5_K"}) {
    EXPECT_GE(checked_types[type], 1) << type;
  }
}

TEST(DequantTest, BlockSizesMatchGgufPy) {
  for (const auto& [name, size] : goldens().at("block_sizes").items()) {
    bool found = false;
    for (uint32_t id = 0; id < 64; ++id) {
      const auto type = static_cast<TensorType>(id);
      if (name != tensor_type_name(type)) continue;
      found = true;
      EXPECT_EQ(block_elements(type), size.at(0).get<size_t>()) << name;
      EXPECT_EQ(block_bytes(type), size.at(1).get<size_t>()) << name;
    }
    EXPECT_TRUE(found) << name;
  }
  EXPECT_EQ(block_bytes(TensorType::kQ8_1), 36u);  // ggml's block_q8_1: two halves, 32 int8
}

TEST(DequantTest, Fp32ToFp16MatchesNumpy) {
  for (const nlohmann::json& pair : goldens().at("fp32_to_fp16")) {
    const auto f32 = pair.at(0).get<uint32_t>();
    const auto f16 = pair.at(1).get<uint16_t>();
    EXPECT_EQ(fp32_to_fp16(std::bit_cast<float>(f32)), f16) << std::hex << "f32 0x" << f32;
  }
}

TEST(DequantTest, Fp32ToBf16MatchesGgufPy) {
  for (const nlohmann::json& pair : goldens().at("fp32_to_bf16")) {
    const auto f32 = pair.at(0).get<uint32_t>();
    const auto bf16 = pair.at(1).get<uint16_t>();
    EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(f32)), bf16) << std::hex << "f32 0x" << f32;
  }
}

TEST(DequantTest, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float f = fp16_to_fp32(half);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f)))) << std::hex << h;
      EXPECT_EQ(fp32_to_fp16(f) & 0x8000, h & 0x8000) << std::hex << h;
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(f), half) << std::hex << h;
    const float b = bf16_to_fp32(half);
    if (!std::isnan(b)) {
      ASSERT_EQ(fp32_to_bf16(b), half) << std::hex << h;
    }
  }
}

// Checks fp32 -> fp16 against the definition: the result is a nearest half, ties to even.
TEST(DequantTest, Fp32ToFp16IsNearestEven) {
  for (uint64_t bits = 0; bits < 0x477FF000; bits += 997) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
    const uint16_t h = fp32_to_fp16(f);
    const double error = std::fabs(static_cast<double>(fp16_to_fp32(h)) - f);
    for (int step : {-1, 1}) {
      const int neighbor = h + step;
      if (neighbor < 0 || neighbor >= 0x7C00) continue;
      const double other =
          std::fabs(static_cast<double>(fp16_to_fp32(static_cast<uint16_t>(neighbor))) - f);
      ASSERT_LE(error, other) << std::hex << "f32 0x" << bits;
      if (error == other) {
        ASSERT_EQ(h & 1, 0) << std::hex << "tie at f32 0x" << bits;
      }
    }
    ASSERT_EQ(fp32_to_fp16(-f), h | 0x8000) << std::hex << bits;
  }
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);  // halfway to 65536 rounds to inf
  EXPECT_EQ(fp32_to_fp16(65519.99f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(INFINITY), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-INFINITY), 0xFC00);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(NAN))));
}

TEST(DequantTest, Bf16SpecialValues) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x7F7FFFFFu)), 0x7F80);  // max float -> inf
  EXPECT_EQ(fp32_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);  // signaling NaN quieted
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x00000001u)), 0x0000);  // subnormal rounds
  EXPECT_EQ(bf16_to_fp32(0xC000), -2.0f);
}

TEST(DequantTest, SupportedTypes) {
  for (TensorType type :
       {TensorType::kF32, TensorType::kF16, TensorType::kBF16, TensorType::kQ4_0, TensorType::kQ4_1,
        TensorType::kQ5_0, TensorType::kQ5_1, TensorType::kQ8_0, TensorType::kQ2_K,
        TensorType::kQ3_K, TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K}) {
    EXPECT_TRUE(is_supported(type)) << tensor_type_name(type);
  }
  for (TensorType type : {TensorType::kQ8_1, TensorType::kQ8_K, TensorType::kI8, TensorType::kI32,
                          TensorType::kF64, static_cast<TensorType>(99)}) {
    EXPECT_FALSE(is_supported(type)) << tensor_type_name(type);
  }
  EXPECT_STREQ(tensor_type_name(static_cast<TensorType>(99)), "unknown");
}

TEST(DequantTest, RowBytes) {
  EXPECT_EQ(row_bytes(TensorType::kF32, 640), 2560u);
  EXPECT_EQ(row_bytes(TensorType::kQ8_0, 640), 680u);
  EXPECT_EQ(row_bytes(TensorType::kQ5_0, 640), 440u);
  EXPECT_EQ(row_bytes(TensorType::kQ4_K, 1024), 576u);
  EXPECT_EQ(row_bytes(TensorType::kQ6_K, 2048), 1680u);
}

TEST(DequantTest, Errors) {
  const auto expect_kind = [](GgufErrorKind kind, auto fn) {
    try {
      fn();
      ADD_FAILURE() << "no GgufError";
    } catch (const GgufError& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
    }
  };
  std::vector<uint8_t> src(1024);
  std::vector<float> dst(512);
  expect_kind(GgufErrorKind::kBadShape, [] { row_bytes(TensorType::kQ4_K, 100); });
  expect_kind(GgufErrorKind::kSizeOverflow, [] { row_bytes(TensorType::kF32, ~uint64_t{0}); });
  expect_kind(GgufErrorKind::kUnknownTensorType,
              [] { block_elements(static_cast<TensorType>(99)); });
  expect_kind(GgufErrorKind::kUnknownTensorType, [] { block_bytes(static_cast<TensorType>(4)); });
  expect_kind(GgufErrorKind::kUnknownTensorType,
              [&] { dequantize(TensorType::kQ8_K, src.data(), dst.data(), 256); });
  expect_kind(GgufErrorKind::kBadShape,
              [&] { dequantize(TensorType::kQ8_0, src.data(), dst.data(), 33); });
}

TEST(DequantTest, Q8_0SimpleBlock) {
  std::vector<uint8_t> block = {0x00, 0x38};  // fp16 0.5
  for (int i = 0; i < 32; ++i) block.push_back(static_cast<uint8_t>(static_cast<int8_t>(i - 16)));
  std::vector<float> out(32);
  dequantize(TensorType::kQ8_0, block.data(), out.data(), out.size());
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(out[static_cast<size_t>(i)], 0.5f * static_cast<float>(i - 16));
}

}  // namespace
}  // namespace kestrel::gguf
