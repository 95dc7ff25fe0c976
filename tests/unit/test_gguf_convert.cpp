// GGUF tensors converted to kernel forms at load (quant/gguf_convert.h), checked against
// gguf-py's dequantization of the same blocks (tests/goldens/dequant.json: blocks of the default
// model, crafted and random ones), not against Kestrel's own dequantizer.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/quant/gguf_convert.h"
#include "source_dir.h"

namespace kestrel::quant {
namespace {

using gguf::TensorType;

struct Case {
  std::string name;
  TensorType type;
  std::vector<std::byte> bytes;
  std::vector<float> values;  // gguf-py's dequantization
};

std::vector<Case> golden_cases() {
  std::ifstream in(::kestrel::testing::source_dir() / "tests/goldens/dequant.json");
  EXPECT_TRUE(in.good()) << "missing tests/goldens/dequant.json";
  std::vector<Case> cases;
  if (!in.good()) return cases;
  const nlohmann::json goldens = nlohmann::json::parse(in);
  for (const auto& c : goldens.at("cases")) {
    Case k;
    k.name = c.at("name").get<std::string>();
    k.type = static_cast<TensorType>(c.at("type_id").get<uint32_t>());
    const std::string hex = c.at("bytes").get<std::string>();
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
      k.bytes.push_back(static_cast<std::byte>(std::stoul(hex.substr(i, 2), nullptr, 16)));
    }
    for (uint32_t bits : c.at("values").get<std::vector<uint32_t>>()) k.values.push_back(std::bit_cast<float>(bits));
    cases.push_back(std::move(k));
  }
  return cases;
}

std::vector<float> row_of(const kernels::Matrix& m) {
  std::vector<float> row(m.cols);
  kernels::matrix_row(m, 0, row.data());
  return row;
}

TEST(GgufConvert, KernelFormsByType) {
  EXPECT_EQ(kernel_form(TensorType::kQ4_0), KernelForm::kInt4);
  EXPECT_EQ(kernel_form(TensorType::kQ4_1), KernelForm::kInt4);
  EXPECT_EQ(kernel_form(TensorType::kQ4_K), KernelForm::kInt4);
  for (auto t : {TensorType::kQ5_0, TensorType::kQ5_1, TensorType::kQ2_K, TensorType::kQ3_K, TensorType::kQ5_K,
                 TensorType::kQ6_K}) {
    EXPECT_EQ(kernel_form(t), KernelForm::kQ8_0) << gguf::tensor_type_name(t);
  }
  for (auto t : {TensorType::kQ8_0, TensorType::kBF16, TensorType::kF16, TensorType::kF32}) {
    EXPECT_EQ(kernel_form(t), KernelForm::kInPlace) << gguf::tensor_type_name(t);
  }
}

// Q4_0 and Q4_1 keep their fp16 parameters and codes: the INT4 matrix holds gguf-py's values
// exactly (a Q4_0 zero whose scale is negative comes out +0, not -0). Q4_K's group parameters d * sc and dmin * m are rounded once to fp16, so each weight
// moves by at most 2^-11 of its group's |d * sc| * q + |dmin * m| (and by less than the source's
// smallest step: the codes are kept).
TEST(GgufConvert, Int4FormHoldsGgufPysValues) {
  ThreadPool pool(2);
  int checked = 0;
  for (const Case& c : golden_cases()) {
    if (kernel_form(c.type) != KernelForm::kInt4) continue;
    SCOPED_TRACE(c.name);
    const size_t n = c.values.size();
    const W4Matrix q = w4_from_gguf(c.type, c.bytes, 1, n, pool);
    ASSERT_EQ(q.group_size, 32u);
    EXPECT_EQ(q.mins.empty(), c.type == TensorType::kQ4_0);
    const std::vector<float> got = row_of(q.view());
    size_t exact = 0;
    for (size_t i = 0; i < n; ++i) {
      if (c.type != TensorType::kQ4_K) {
        EXPECT_EQ(got[i], c.values[i]) << "element " << i;  // equal values (+0 for gguf-py's -0 in Q4_0)
        continue;
      }
      // The source's own group parameters, to bound the fp16 rounding.
      const auto* block = reinterpret_cast<const uint8_t*>(c.bytes.data()) + (i / 256) * 144;
      int sc = 0, m = 0;
      gguf::k_quant_scale_min(block + 4, (i % 256) / 32, &sc, &m);
      uint16_t d16 = 0, dmin16 = 0;
      std::memcpy(&d16, block, 2);
      std::memcpy(&dmin16, block + 2, 2);
      const double step = std::fabs(static_cast<double>(gguf::fp16_to_fp32(d16)) * sc), min = std::fabs(static_cast<double>(gguf::fp16_to_fp32(dmin16)) * m);
      const double bound = std::ldexp(15.0 * step + min, -11) + 1e-30;
      EXPECT_LE(std::fabs(static_cast<double>(got[i]) - c.values[i]), bound) << "element " << i;
      exact += got[i] == c.values[i];
    }
    if (c.type == TensorType::kQ4_K) std::printf("%s: %zu of %zu weights exact\n", c.name.c_str(), exact, n);
    ++checked;
  }
  EXPECT_GE(checked, 5);  // Q4_0, 2 Q4_1, 3 Q4_K blocks (two of them the default model's)
}

// Every other quantized type goes to Q8_0 at d = max|w| / 127 per 32: each weight within
// d / 2 of gguf-py's value, plus the fp16 rounding of d over at most 127 steps.
TEST(GgufConvert, Q8_0FormIsWithinHalfAStepOfGgufPysValues) {
  ThreadPool pool(2);
  int checked = 0;
  for (const Case& c : golden_cases()) {
    if (kernel_form(c.type) != KernelForm::kQ8_0) continue;
    SCOPED_TRACE(c.name);
    const size_t n = c.values.size();
    const std::vector<std::byte> q8 = q8_0_from_gguf(c.type, c.bytes, 1, n, pool);
    ASSERT_EQ(q8.size(), n / 32 * 34);
    std::vector<float> got(n);
    gguf::dequantize(TensorType::kQ8_0, q8.data(), got.data(), n);
    for (size_t b = 0; b < n / 32; ++b) {
      double amax = 0;
      for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(static_cast<double>(c.values[b * 32 + i])));
      const double d = amax / 127, bound = d / 2 + std::ldexp(d * 127, -11) + 1e-30;
      for (size_t i = b * 32; i < b * 32 + 32; ++i) {
        EXPECT_LE(std::fabs(static_cast<double>(got[i]) - c.values[i]), bound) << "element " << i;
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// Two rows convert as each row alone (row-major, rows independent), over threads.
TEST(GgufConvert, RowsConvertIndependently) {
  ThreadPool pool(3);
  int checked = 0;
  for (const Case& c : golden_cases()) {
    if (c.name != "random_Q4_K" && c.name != "model_Q4_K_start" && c.name != "random_Q6_K") continue;
    SCOPED_TRACE(c.name);
    const size_t n = c.values.size();
    std::vector<std::byte> two(c.bytes);
    two.insert(two.end(), c.bytes.begin(), c.bytes.end());
    if (kernel_form(c.type) == KernelForm::kInt4) {
      const W4Matrix one = w4_from_gguf(c.type, c.bytes, 1, n, pool);
      const W4Matrix both = w4_from_gguf(c.type, two, 2, n, pool);
      std::vector<float> r0(n), r1(n);
      kernels::matrix_row(both.view(), 0, r0.data());
      kernels::matrix_row(both.view(), 1, r1.data());
      EXPECT_EQ(r0, row_of(one.view()));
      EXPECT_EQ(r1, r0);
    } else {
      const auto one = q8_0_from_gguf(c.type, c.bytes, 1, n, pool);
      const auto both = q8_0_from_gguf(c.type, two, 2, n, pool);
      ASSERT_EQ(both.size(), 2 * one.size());
      EXPECT_TRUE(std::equal(one.begin(), one.end(), both.begin()));
      EXPECT_TRUE(std::equal(one.begin(), one.end(), both.begin() + static_cast<std::ptrdiff_t>(one.size())));
    }
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

TEST(GgufConvert, BadInputIsAnError) {
  ThreadPool pool(1);
  std::vector<std::byte> block(144);
  EXPECT_THROW(w4_from_gguf(TensorType::kQ6_K, block, 1, 256, pool), Error);  // no exact INT4 form
  EXPECT_THROW(w4_from_gguf(TensorType::kQ4_K, block, 2, 256, pool), Error);  // too few bytes
  EXPECT_THROW(w4_from_gguf(TensorType::kQ4_K, block, 1, 128, pool), Error);  // not whole blocks
  EXPECT_THROW(q8_0_from_gguf(TensorType::kF32, std::vector<std::byte>(40 * 4), 1, 40, pool), Error);
  // A Q4_K block whose d * sc overflows fp16: d = 65504, sub-block 0's scale 63.
  const uint16_t big = 0x7BFF;
  std::memcpy(block.data(), &big, 2);
  block[4] = std::byte{63};
  EXPECT_THROW(w4_from_gguf(TensorType::kQ4_K, block, 1, 256, pool), Error);
}

}  // namespace
}  // namespace kestrel::quant
