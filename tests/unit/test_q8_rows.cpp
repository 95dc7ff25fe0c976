// The row-major int8 kernel for Q8_0 matrices (kernels/gemv_q8_rows.h): every path this CPU
// runs writes, for every token range and row range, exactly the bits of gemv_q8_interleaved's
// portable path on an interleaved copy of the same matrix (whose own test checks it against a
// float64 sum of the formula); the float64 sum is checked here too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/gemv_q8_rows.h"
#include "random_q8.h"

namespace k = kestrel::kernels;

namespace {

using kestrel::testing::random_q8_0;
using kestrel::testing::edge_activations;
using kestrel::testing::q8_0_view;

TEST(Q8Rows, EveryPathWritesTheInterleavedKernelsBits) {
  for (auto [rows, cols] : std::vector<std::pair<size_t, size_t>>{{8, 32}, {16, 640}, {37, 64}, {64, 2560}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const auto bytes = random_q8_0(rows, cols, 7 * rows + cols);
    const k::Matrix m = q8_0_view(bytes, rows, cols);
    // 21 tokens: from 8 the AVX512-VNNI path interleaves 16 rows at a time on the fly.
    const size_t n = 21;
    const auto x = edge_activations(n, cols, rows);
    k::Q8Activations xq;
    k::quantize_q8_activations(x.data(), n, cols, cols, xq);
    std::vector<float> expected(n * rows);
    k::gemv_q8_interleaved_scalar(k::interleave_q8_0(m), xq, expected.data(), rows, 0, rows);
    // float64 sum of the formula: sum_b (sum_i w q) * s * d.
    for (size_t t = 0; t < n; ++t) {
      for (size_t r = 0; r < rows; ++r) {
        double magnitude = 0;
        const double ref = kestrel::testing::q8_0_reference(m, xq, t, r, &magnitude);
        ASSERT_NEAR(expected[t * rows + r], ref, 1e-5 * magnitude + 1e-30) << "r=" << r;
      }
    }
    for (k::Int8Isa isa : k::int8_isas_available()) {
      SCOPED_TRACE(k::int8_isa_name(isa));
      // Row ranges that cut the 8-row passes, token ranges that skip the first tokens.
      for (auto [r0, r1] : std::vector<std::pair<size_t, size_t>>{{0, rows}, {3, rows}, {1, rows - 1}, {rows - 1, rows}}) {
        for (auto [t0, t1] : std::vector<std::pair<size_t, size_t>>{{0, n}, {2, 3}, {4, 5}, {3, 12}, {1, 20}}) {
          std::vector<float> y((t1 - t0) * rows, -1.0f);
          k::gemv_q8_rows_on(isa, m, xq, t0, t1, y.data(), rows, r0, r1);
          for (size_t t = t0; t < t1; ++t) {
            for (size_t r = 0; r < rows; ++r) {
              const float got = y[(t - t0) * rows + r];
              if (r < r0 || r >= r1) {
                ASSERT_EQ(got, -1.0f) << "wrote outside its rows";
              } else {
                ASSERT_EQ(got, expected[t * rows + r]) << "t=" << t << " r=" << r << " rows " << r0 << ".." << r1;
              }
            }
          }
        }
      }
    }
  }
  if (k::int8_isas_available().size() == 1) GTEST_SKIP() << "checked the portable path only: no AVX2 or AVX512-VNNI";
}

// FlashHead's stage 2 scores a cluster for the scattered rows of a step that probe it: tokens
// listed by index (any order, repeats) give gemv_q8_rows' bits for each, on every path.
TEST(Q8Rows, ListedTokensGetTheRangeKernelsBits) {
  for (auto [rows, cols] : std::vector<std::pair<size_t, size_t>>{{16, 640}, {37, 64}, {8, 32}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const auto bytes = random_q8_0(rows, cols, 5 * rows + cols);
    const k::Matrix m = q8_0_view(bytes, rows, cols);
    const size_t n = 9;
    const auto x = edge_activations(n, cols, rows + 1);
    k::Q8Activations xq;
    k::quantize_q8_activations(x.data(), n, cols, cols, xq);
    std::vector<float> expected(n * rows);
    k::gemv_q8_rows_on(k::Int8Isa::kPortable, m, xq, 0, n, expected.data(), rows, 0, rows);
    const std::vector<std::vector<size_t>> lists = {{5}, {8, 0}, {3, 7, 1}, {6, 2, 6, 4}};
    for (k::Int8Isa isa : k::int8_isas_available()) {
      SCOPED_TRACE(k::int8_isa_name(isa));
      for (const auto& tokens : lists) {
        for (auto [r0, r1] : std::vector<std::pair<size_t, size_t>>{{0, rows}, {3, rows}, {1, rows - 1}}) {
          std::vector<std::vector<float>> y(tokens.size(), std::vector<float>(rows + 1, -1.0f));
          std::vector<float*> outs;
          for (auto& v : y) outs.push_back(v.data());
          k::gemv_q8_rows_tokens_on(isa, m, xq, tokens, outs, r0, r1);
          for (size_t i = 0; i < tokens.size(); ++i) {
            for (size_t r = r0; r < r1; ++r) {
              ASSERT_EQ(y[i][r - r0], expected[tokens[i] * rows + r]) << "token " << tokens[i] << " r=" << r;
            }
            ASSERT_EQ(y[i][r1 - r0], -1.0f) << "wrote past its rows";
          }
        }
      }
    }
  }
  const auto bytes = random_q8_0(16, 64, 3);
  const k::Matrix m = q8_0_view(bytes, 16, 64);
  k::Q8Activations xq;
  k::quantize_q8_activations(std::vector<float>(128, 1.0f).data(), 2, 64, 64, xq);
  std::vector<float> y(16);
  std::vector<float*> five(5, y.data());
  const std::vector<size_t> none, past = {2}, too_many = {0, 1, 0, 1, 0};
  EXPECT_THROW(k::gemv_q8_rows_tokens(m, xq, none, {}, 0, 16), kestrel::Error);
  EXPECT_THROW(k::gemv_q8_rows_tokens(m, xq, past, std::span(five).first(1), 0, 16), kestrel::Error);
  EXPECT_THROW(k::gemv_q8_rows_tokens(m, xq, too_many, five, 0, 16), kestrel::Error);
  EXPECT_THROW(k::gemv_q8_rows_tokens(m, xq, std::span(too_many).first(2), std::span(five).first(1), 0, 16),
               kestrel::Error);  // one output for two tokens
}

TEST(Q8Rows, BadArgumentsAreErrors) {
  const auto bytes = random_q8_0(16, 64, 3);
  const k::Matrix m = q8_0_view(bytes, 16, 64);
  k::Q8Activations xq;
  k::quantize_q8_activations(std::vector<float>(64, 1.0f).data(), 1, 64, 64, xq);
  std::vector<float> y(32);
  EXPECT_NO_THROW(k::gemv_q8_rows(m, xq, 0, 1, y.data(), 16, 0, 16));
  EXPECT_THROW(k::gemv_q8_rows(m, xq, 0, 1, y.data(), 16, 0, 17), kestrel::Error);  // past the rows
  EXPECT_THROW(k::gemv_q8_rows(m, xq, 0, 2, y.data(), 16, 0, 16), kestrel::Error);  // past the tokens
  k::Q8Activations narrow;
  k::quantize_q8_activations(std::vector<float>(32, 1.0f).data(), 1, 32, 32, narrow);
  EXPECT_THROW(k::gemv_q8_rows(m, narrow, 0, 1, y.data(), 16, 0, 16), kestrel::Error);  // 32 vs 64 columns
  k::Matrix f32 = m;
  f32.type = k::WeightType::kF32;
  EXPECT_THROW(k::gemv_q8_rows(f32, xq, 0, 1, y.data(), 16, 0, 16), kestrel::Error);
  for (k::Int8Isa isa : {k::Int8Isa::kAvx2, k::Int8Isa::kAvx512Vnni}) {
    if (k::int8_isa_available(isa)) continue;
    EXPECT_THROW(k::gemv_q8_rows_on(isa, m, xq, 0, 1, y.data(), 16, 0, 16), kestrel::Error) << k::int8_isa_name(isa);
  }
}

}  // namespace
