// AWQ ("gemm") and GPTQ packed INT4 layouts read by `kestrel build` (image/hf_awq_gptq.h): words
// written here as the libraries' packers define them (AutoAWQ 0.2.9 WQLinear_GEMM.from_linear:
// nibble i of a word holds output 8 * word + order_map[i], order_map = 0, 2, 4, 6, 1, 3, 5, 7;
// GPTQModel 7.7.0 pack_original: input 8 * word + j at bits 4 * j; its v2 -> v1 conversion
// subtracts 0x11111111 from each qzeros word), read back into Kestrel's kW4 layout.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/image/hf_awq_gptq.h"

namespace img = kestrel::image;

namespace {

// The code of (row r, column c) from kW4 bytes: per group of G, byte j holds column j (low
// nibble) and j + G/2 (high nibble).
unsigned kw4_code(const std::vector<uint8_t>& q4, size_t cols, size_t G, size_t r, size_t c) {
  const size_t g = c / G, i = c % G, half = G / 2;
  const uint8_t byte = q4[r * cols / 2 + g * half + (i < half ? i : i - half)];
  return i < half ? byte & 0xFu : byte >> 4;
}

constexpr unsigned kOrderMap[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // AutoAWQ's packing order

}  // namespace

TEST(AwqGptqLayout, AwqWordInterleavesItsEightOutputs) {
  // Input 0, outputs 0..7 with codes 0..7: nibble i holds output order_map[i] -> 0x75316420.
  const size_t rows = 8, cols = 32, G = 32;
  std::vector<int32_t> qweight(cols * rows / 8, 0);
  qweight[0] = static_cast<int32_t>(0x75316420u);
  const auto q4 = img::awq_unpack_codes(qweight, rows, cols, G);
  for (size_t r = 0; r < rows; ++r) EXPECT_EQ(kw4_code(q4, cols, G, r, 0), r) << r;
  for (size_t r = 0; r < rows; ++r) EXPECT_EQ(kw4_code(q4, cols, G, r, 1), 0u) << r;
}

TEST(AwqGptqLayout, AwqCodesAndZerosMatchTheLibrarysPacking) {
  const size_t rows = 24, cols = 128, G = 64, n_groups = cols / G;
  std::mt19937 rng(3);
  std::vector<unsigned> codes(rows * cols), zeros(rows * n_groups);
  for (auto& x : codes) x = rng() % 16;
  for (auto& x : zeros) x = rng() % 16;
  // AutoAWQ: intweight is [in, out]; qweight[:, col] |= intweight[:, col * 8 + order_map[i]] << 4i.
  std::vector<int32_t> qweight(cols * rows / 8, 0), qzeros(n_groups * rows / 8, 0);
  for (size_t c = 0; c < cols; ++c) {
    for (size_t col = 0; col < rows / 8; ++col) {
      uint32_t word = 0;
      for (unsigned i = 0; i < 8; ++i) word |= codes[(col * 8 + kOrderMap[i]) * cols + c] << (4 * i);
      qweight[c * rows / 8 + col] = static_cast<int32_t>(word);
    }
  }
  for (size_t g = 0; g < n_groups; ++g) {
    for (size_t col = 0; col < rows / 8; ++col) {
      uint32_t word = 0;
      for (unsigned i = 0; i < 8; ++i) word |= zeros[(col * 8 + kOrderMap[i]) * n_groups + g] << (4 * i);
      qzeros[g * rows / 8 + col] = static_cast<int32_t>(word);
    }
  }
  const auto q4 = img::awq_unpack_codes(qweight, rows, cols, G);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) ASSERT_EQ(kw4_code(q4, cols, G, r, c), codes[r * cols + c]) << r << " " << c;
  }
  const auto z = img::awq_unpack_zeros(qzeros, rows, n_groups);
  for (size_t i = 0; i < z.size(); ++i) ASSERT_EQ(z[i], zeros[i]) << i;
  EXPECT_THROW(img::awq_unpack_codes(qweight, rows, cols + 8, G), kestrel::Error);
  EXPECT_THROW(img::awq_unpack_zeros(qzeros, rows - 8, n_groups), kestrel::Error);
}

TEST(AwqGptqLayout, GptqPacksAlongTheInputLowNibbleFirst) {
  const size_t rows = 3, cols = 64, G = 32;
  std::vector<int32_t> qweight(cols / 8 * rows, 0);
  qweight[0 * rows + 1] = static_cast<int32_t>(0x76543210u);  // output 1, inputs 0..7
  qweight[7 * rows + 2] = static_cast<int32_t>(0xF0000000u);  // output 2, input 63
  const auto q4 = img::gptq_unpack_codes(qweight, rows, cols, G);
  for (size_t c = 0; c < 8; ++c) EXPECT_EQ(kw4_code(q4, cols, G, 1, c), c);
  EXPECT_EQ(kw4_code(q4, cols, G, 2, 63), 15u);
  EXPECT_EQ(kw4_code(q4, cols, G, 2, 62), 0u);
  EXPECT_EQ(kw4_code(q4, cols, G, 0, 0), 0u);
}

TEST(AwqGptqLayout, GptqV1ZerosAreUndoneWordWiseWithTheirBorrows) {
  // v2 zeros 0..7 of outputs 0..7: word 0x76543210; v1 stores 0x76543210 - 0x11111111 =
  // 0x654320FF (zero point 0 borrows from its neighbour).
  const size_t rows = 8, n_groups = 1;
  const std::vector<int32_t> v1 = {static_cast<int32_t>(0x654320FFu)};
  const auto z = img::gptq_unpack_zeros(v1, rows, n_groups, true);
  for (size_t r = 0; r < rows; ++r) EXPECT_EQ(z[r], r);
  const std::vector<int32_t> v2 = {static_cast<int32_t>(0x76543210u)};
  EXPECT_EQ(img::gptq_unpack_zeros(v2, rows, n_groups, false), z);
  // Symmetric v1: 8 - 1 = 7 in every nibble.
  const std::vector<int32_t> sym = {0x77777777};
  for (auto v : img::gptq_unpack_zeros(sym, rows, n_groups, true)) EXPECT_EQ(v, 8);
}

TEST(AwqGptqLayout, GptqZerosArePackedAlongTheOutputsWithAPartialLastWord) {
  const size_t rows = 12, n_groups = 2;  // [n_groups, 2] words: outputs 8..11 in the low half of word 1
  std::vector<int32_t> qzeros = {0x11111111, 0x00004321, 0x22222222, 0x00008765};
  const auto z = img::gptq_unpack_zeros(qzeros, rows, n_groups, false);
  for (size_t r = 0; r < 8; ++r) {
    EXPECT_EQ(z[r * n_groups + 0], 1);
    EXPECT_EQ(z[r * n_groups + 1], 2);
  }
  for (size_t r = 8; r < 12; ++r) {
    EXPECT_EQ(z[r * n_groups + 0], r - 7);
    EXPECT_EQ(z[r * n_groups + 1], r - 3);
  }
  EXPECT_THROW(img::gptq_unpack_zeros(qzeros, 17, n_groups, false), kestrel::Error);
}

TEST(AwqGptqLayout, ConfigsAreRecognisedOrRefusedWithTheReason) {
  using nlohmann::json;
  auto cfg = [](json q) { return json{{"quantization_config", q}}; };
  EXPECT_FALSE(img::awq_gptq_scheme(json::object(), "/nonexistent").has_value());
  EXPECT_FALSE(img::awq_gptq_scheme(cfg({{"quant_method", "compressed-tensors"}}), "/nonexistent").has_value());
  const auto awq = img::awq_gptq_scheme(
      cfg({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"zero_point", true}, {"version", "gemm"}}), "/nonexistent");
  ASSERT_TRUE(awq);
  EXPECT_EQ(awq->format, img::PackedInt4Format::kAwqGemm);
  EXPECT_EQ(awq->group_size, 128u);
  EXPECT_FALSE(awq->symmetric);
  const auto v1 = img::awq_gptq_scheme(cfg({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 32}, {"sym", true}}), "/nonexistent");
  ASSERT_TRUE(v1);
  EXPECT_TRUE(v1->gptq_v1);
  EXPECT_TRUE(v1->symmetric);
  const auto v2 = img::awq_gptq_scheme(
      cfg({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 64}, {"sym", false}, {"checkpoint_format", "gptq_v2"}}), "/nonexistent");
  ASSERT_TRUE(v2);
  EXPECT_FALSE(v2->gptq_v1);
  EXPECT_FALSE(v2->symmetric);
  auto refused = [&](json q, const char* why) {
    try {
      img::awq_gptq_scheme(cfg(q), "/nonexistent");
      ADD_FAILURE() << "accepted " << q.dump();
    } catch (const kestrel::Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused({{"quant_method", "gptq"}, {"bits", 8}, {"group_size", 128}}, "bits 8");
  refused({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", -1}}, "group_size -1");
  refused({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 16}}, "group_size 16");
  refused({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"checkpoint_format", "marlin"}}, "marlin");
  refused({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"pack_dtype", "int16"}}, "pack_dtype");
  refused({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"version", "gemv"}}, "gemv");
  refused({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"zero_point", false}}, "zero_point false");
}
