// INT4 quantization and the W4 / BF16 matmul kernels against scalar references.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemm_bf16.h"
#include "kestrel/kernels/gemv_w4_bf16.h"
#include "kestrel/kernels/gemv_w4_interleaved.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/quant/w4.h"

namespace k = kestrel::kernels;
namespace q = kestrel::quant;

namespace {

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace

TEST(W4, GridValuesRoundTripExactly) {
  // Weights already on an INT4 grid with the extreme at -8 * d are reproduced exactly.
  kestrel::ThreadPool pool(1);
  const float d = 0.125f;  // exact in fp16
  std::vector<float> w(64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = d * static_cast<float>(static_cast<int>(i % 16) - 8);
  const auto m = q::quantize_w4(w.data(), 2, 32, 32, nullptr, false, pool);
  EXPECT_EQ(q::w4_rms_error(m, w.data()), 0.0);
  EXPECT_EQ(kestrel::gguf::fp16_to_fp32(m.scales[0]), d);
  // Nibble order: byte j holds weights j (low) and j + 16 (high).
  EXPECT_EQ(m.qs[0], (0 | (0 << 4)));   // w[0] = -8d -> 0, w[16] = -8d -> 0
  EXPECT_EQ(m.qs[1], (1 | (1 << 4)));   // w[1] = -7d, w[17] = -7d
}

TEST(W4, ScaleSearchNeverWorseThanQ4_0Rule) {
  // ggml's Q4_0 picks d = m / -8 (m: the weight of largest magnitude); the search includes it,
  // so its error can only be lower. Relative RMS error of 4-bit RTN on Gaussian weights with
  // groups of 32 is about 0.1 (e.g. Dettmers & Zettlemoyer 2023, Fig. 2 regime).
  kestrel::ThreadPool pool(2);
  const size_t rows = 64, cols = 256;
  const auto w = gaussian(rows * cols, 11);
  const auto m = q::quantize_w4(w.data(), rows, cols, 32, nullptr, false, pool);
  double q4_0 = 0.0;
  for (size_t g = 0; g < rows * cols / 32; ++g) {
    const float* x = &w[g * 32];
    float mx = 0;
    for (int i = 0; i < 32; ++i) if (std::fabs(x[i]) > std::fabs(mx)) mx = x[i];
    const float dq = kestrel::gguf::fp16_to_fp32(kestrel::gguf::fp32_to_fp16(mx / -8.0f));
    for (int i = 0; i < 32; ++i) {
      const float qi = std::clamp(std::nearbyint(x[i] / dq) + 8.0f, 0.0f, 15.0f);
      const double e = x[i] - dq * (qi - 8.0f);
      q4_0 += e * e;
    }
  }
  q4_0 = std::sqrt(q4_0 / static_cast<double>(rows * cols));
  const double ours = q::w4_rms_error(m, w.data());
  EXPECT_LE(ours, q4_0 + 1e-9);
  EXPECT_GT(ours, 0.05);
  EXPECT_LT(ours, 0.12);
}

TEST(W4, RejectsBadGroupSizes) {
  kestrel::ThreadPool pool(1);
  std::vector<float> w(96);
  EXPECT_THROW(q::quantize_w4(w.data(), 1, 96, 64, nullptr, false, pool), kestrel::Error);
  EXPECT_THROW(q::quantize_w4(w.data(), 1, 96, 48, nullptr, true, pool), kestrel::Error);
}

TEST(W4, MatmulMatchesDequantizedReference) {
  kestrel::ThreadPool pool(3);
  for (auto [rows, cols, group, n] : std::vector<std::tuple<size_t, size_t, size_t, size_t>>{
           {1, 32, 32, 1}, {37, 96, 32, 5}, {19, 128, 64, 3}, {64, 640, 32, 9}, {33, 256, 128, 4}}) {
    const auto w = gaussian(rows * cols, 21);
    const auto x = gaussian(n * cols, 22);
    for (int variant : {0, 1, 2}) {  // symmetric, affine, affine with 8-bit group parameters
      const bool zero_points = variant != 0;
      auto m = q::quantize_w4(w.data(), rows, cols, group, nullptr, zero_points, pool);
      if (variant == 2) q::compress_group_params(m, w.data(), nullptr, pool);
      std::vector<float> y(n * rows), ref(n * rows), row(cols);
      k::matmul(m.view(), x.data(), n, cols, y.data(), rows, pool);
      k::matmul_reference(m.view(), x.data(), n, cols, ref.data(), rows);
      // Prefill (8+ tokens) may use bfloat16 dot products, and decode the bf16 GEMV: both
      // round the activations (prefill also the weights) to 8 significant bits, so each
      // product is off by at most ~2^-8 relative.
      const bool bf16 = n >= 8 ? k::bf16_dot_available() && cols % 32 == 0
                               : k::gemv_w4_bf16_supported(m.view());
      for (size_t r = 0; r < rows; ++r) {
        k::matrix_row(m.view(), r, row.data());
        for (size_t t = 0; t < n; ++t) {
          double magnitude = 0;
          for (size_t i = 0; i < cols; ++i) magnitude += std::fabs(row[i] * x[t * cols + i]);
          const double tol = bf16 ? magnitude / 128 : 2e-5 * std::sqrt(static_cast<double>(cols)) * 4;
          EXPECT_NEAR(y[t * rows + r], ref[t * rows + r], tol)
              << rows << "x" << cols << "/" << group << " variant " << variant << " r=" << r << " t=" << t;
        }
      }
    }
  }
}

TEST(W4, Bf16GemvMatchesRoundedReference) {
  // gemv_w4_bf16 against float64 sums of the dequantized weights times the bf16-rounded
  // activations: only float32 rounding may separate them. Shapes cover every group layout the
  // kernel takes (groups of 32 and 64 share a 64-byte load, 128 fills it, 256 spans two).
  kestrel::ThreadPool pool(1);
  bool ran = false;
  for (auto [rows, cols, group] : std::vector<std::tuple<size_t, size_t, size_t>>{
           {5, 128, 32}, {7, 640, 32}, {3, 384, 64}, {4, 512, 128}, {6, 768, 256}, {2, 2560, 32}}) {
    const auto w = gaussian(rows * cols, 61);
    auto x = gaussian(cols, 62);
    x[3] = 1e-3f;  // small and large activations in one group
    x[cols - 1] = 40.0f;
    for (int variant : {0, 1, 2}) {  // symmetric, affine, affine with 8-bit group parameters
      const bool zero_points = variant != 0;
      auto m = q::quantize_w4(w.data(), rows, cols, group, nullptr, zero_points, pool);
      if (variant == 2) q::compress_group_params(m, w.data(), nullptr, pool);
      if (!k::gemv_w4_bf16_supported(m.view())) continue;
      ran = true;
      k::W4GemvInput input;
      k::prepare_w4_gemv(x.data(), cols, group, input);
      std::vector<float> y(rows + 2, -1.0f), row(cols);
      k::gemv_w4_bf16(m.view(), input, y.data(), 1, rows);  // rows [1, rows): y[0] untouched
      EXPECT_EQ(y[0], -1.0f);
      EXPECT_EQ(y[rows], -1.0f);
      for (size_t r = 1; r < rows; ++r) {
        k::matrix_row(m.view(), r, row.data());
        double ref = 0, magnitude = 0;
        for (size_t i = 0; i < cols; ++i) {
          const double xi = kestrel::gguf::bf16_to_fp32(kestrel::gguf::fp32_to_bf16(x[i]));
          ref += static_cast<double>(row[i]) * xi;
          magnitude += std::fabs(row[i] * xi);
        }
        EXPECT_NEAR(y[r], ref, 2e-5 * magnitude)
            << rows << "x" << cols << "/" << group << " variant " << variant << " r=" << r;
      }
    }
  }
  if (!ran) GTEST_SKIP() << "this CPU has no AVX512-BF16";
}

TEST(W4, DecodeOfSeveralTokensEqualsOneAtATimeBitForBit) {
  // A batch of decode rows of several sequences, or drafted tokens: gemv_w4_bf16_tokens (up to
  // 8 tokens per unpacking, then the next 8), and matmul through it below kTileMinTokens, give
  // each token exactly what it gets alone, so batching decode rows changes no result.
  kestrel::ThreadPool pool(2);
  constexpr size_t kTokens = 11;
  bool ran = false;
  for (auto [rows, cols, group] : std::vector<std::tuple<size_t, size_t, size_t>>{
           {5, 128, 32}, {37, 640, 32}, {6, 768, 256}}) {
    const auto w = gaussian(rows * cols, 81);
    const auto x = gaussian(kTokens * cols, 82);
    for (int variant : {0, 1, 2}) {
      auto m = q::quantize_w4(w.data(), rows, cols, group, nullptr, variant != 0, pool);
      if (variant == 2) q::compress_group_params(m, w.data(), nullptr, pool);
      if (!k::gemv_w4_bf16_supported(m.view())) continue;
      ran = true;
      std::vector<k::W4GemvInput> inputs(kTokens);
      std::vector<float> alone(kTokens * rows);
      for (size_t t = 0; t < kTokens; ++t) {
        k::prepare_w4_gemv(&x[t * cols], cols, group, inputs[t]);
        k::gemv_w4_bf16(m.view(), inputs[t], &alone[t * rows], 0, rows);
      }
      for (size_t n = 1; n <= kTokens; ++n) {
        std::vector<float> y(n * (rows + 1), -1.0f);
        k::gemv_w4_bf16_tokens(m.view(), inputs.data(), n, y.data(), rows + 1, 0, rows);
        std::vector<float> z(n * rows);
        if (n < k::kTileMinTokens) k::matmul(m.view(), x.data(), n, cols, z.data(), rows, pool);
        for (size_t t = 0; t < n; ++t) {
          EXPECT_EQ(y[t * (rows + 1) + rows], -1.0f);
          for (size_t r = 0; r < rows; ++r) {
            ASSERT_EQ(y[t * (rows + 1) + r], alone[t * rows + r]) << rows << "x" << cols << " n=" << n << " t=" << t;
            if (n < k::kTileMinTokens) {
              ASSERT_EQ(z[t * rows + r], alone[t * rows + r]) << rows << "x" << cols << " n=" << n << " t=" << t;
            }
          }
        }
      }
    }
  }
  if (!ran) GTEST_SKIP() << "this CPU has no AVX512-BF16";
}

TEST(W4, InterleavedDecodeMatchesTheReferenceAndNeverDependsOnItsCompany) {
  // The 16-row interleaved copy (the decode kernel of images and w4a16 loads): against float64
  // sums of the dequantized weights and the bf16-rounded activations, for groups 32-128,
  // symmetric, affine, and affine with 8-bit group parameters; and bit for bit the same per token whatever the number of tokens
  // (1-7: batched decode rows, drafted tokens), the row range (ranges that cut blocks, as the
  // thread pool's split does) and the pool's threads, through matmul.
  bool ran = false;
  for (auto [rows, cols, group] : std::vector<std::tuple<size_t, size_t, size_t>>{
           {16, 128, 32}, {48, 640, 32}, {32, 768, 64}, {64, 256, 128}}) {
    const auto w = gaussian(rows * cols, 91);
    const auto x = gaussian(7 * cols, 92);
    for (int variant : {0, 1, 2}) {  // affine, symmetric, affine with 8-bit group parameters
      const bool affine = variant != 1;
      kestrel::ThreadPool one(1);
      auto m = q::quantize_w4(w.data(), rows, cols, group, nullptr, affine, one);
      if (variant == 2) q::compress_group_params(m, w.data(), nullptr, one);
      if (!k::w4_interleavable(m.view())) continue;
      ASSERT_EQ(k::interleave_w4(m.view()).params8(), variant == 2);
      ran = true;
      const k::W4Interleaved il = k::interleave_w4(m.view());
      k::Matrix view = m.view();
      view.interleaved = &il;
      std::vector<float> alone(7 * rows);
      for (size_t t = 0; t < 7; ++t) k::gemv_w4_interleaved(il, &x[t * cols], 1, cols, &alone[t * rows], rows, 0, rows);
      std::vector<float> row(cols);
      for (size_t t = 0; t < 7; ++t) {
        for (size_t r = 0; r < rows; ++r) {
          k::matrix_row(m.view(), r, row.data());
          double ref = 0, magnitude = 0;
          for (size_t i = 0; i < cols; ++i) {
            const double xi = kestrel::gguf::bf16_to_fp32(kestrel::gguf::fp32_to_bf16(x[t * cols + i]));
            ref += row[i] * xi;
            magnitude += std::fabs(row[i] * xi);
          }
          ASSERT_NEAR(alone[t * rows + r], ref, 2e-5 * magnitude) << rows << "x" << cols << "/" << group << " r=" << r;
        }
      }
      for (size_t n = 1; n < k::kTileMinTokens; ++n) {
        for (auto [begin, end] : std::vector<std::pair<size_t, size_t>>{{0, rows}, {3, rows - 5}, {17 % rows, rows}}) {
          std::vector<float> y(n * rows, -1.0f);
          k::gemv_w4_interleaved(il, x.data(), n, cols, y.data(), rows, begin, end);
          for (size_t t = 0; t < n; ++t) {
            for (size_t r = 0; r < rows; ++r) {
              if (r < begin || r >= end) {
                ASSERT_EQ(y[t * rows + r], -1.0f) << "wrote outside its rows";
              } else {
                ASSERT_EQ(y[t * rows + r], alone[t * rows + r]) << "n=" << n << " rows " << begin << ".." << end;
              }
            }
          }
        }
        for (int threads : {1, 3}) {
          kestrel::ThreadPool pool(threads);
          std::vector<float> z(n * rows);
          k::matmul(view, x.data(), n, cols, z.data(), rows, pool);
          for (size_t i = 0; i < z.size(); ++i) ASSERT_EQ(z[i], alone[i]) << "matmul n=" << n << " threads=" << threads;
        }
      }
    }
  }
  if (!ran) GTEST_SKIP() << "this CPU has no AVX512-BF16";
}

TEST(W4, SameInputMatmulEqualsSeparateMatmulsBitForBit) {
  // Q/K/V-like: three matrices (two INT4 with different row counts, one float32) on one input,
  // for decode (1 token) and prefill (9 tokens), on a pool whose split crosses the matrices.
  kestrel::ThreadPool pool(3);
  const size_t cols = 256;
  const auto wa = gaussian(40 * cols, 71), wb = gaussian(24 * cols, 72), wc = gaussian(9 * cols, 73);
  const auto a = q::quantize_w4(wa.data(), 40, cols, 32, nullptr, true, pool);
  const auto b = q::quantize_w4(wb.data(), 24, cols, 64, nullptr, false, pool);
  const k::Matrix c{k::WeightType::kF32, wc.data(), 9, cols};
  const k::Matrix av = a.view(), bv = b.view();
  for (size_t n : {1, 9}) {
    const auto x = gaussian(n * cols, 74);
    std::vector<float> ya(n * 40), yb(n * 24), yc(n * 9), ra(n * 40), rb(n * 24), rc(n * 9);
    const k::MatmulOutput outs[] = {{&av, ya.data(), 40}, {&bv, yb.data(), 24}, {&c, yc.data(), 9}};
    k::matmul_same_input(outs, x.data(), n, cols, pool);
    k::matmul(av, x.data(), n, cols, ra.data(), 40, pool);
    k::matmul(bv, x.data(), n, cols, rb.data(), 24, pool);
    k::matmul(c, x.data(), n, cols, rc.data(), 9, pool);
    EXPECT_EQ(ya, ra) << n;
    EXPECT_EQ(yb, rb) << n;
    EXPECT_EQ(yc, rc) << n;
  }
  const k::Matrix narrow{k::WeightType::kF32, wc.data(), 9, cols / 2};
  std::vector<float> y(64);
  const k::MatmulOutput mixed[] = {{&av, y.data(), 40}, {&narrow, y.data(), 9}};
  const auto x = gaussian(cols, 75);
  EXPECT_THROW(k::matmul_same_input(mixed, x.data(), 1, cols, pool), kestrel::Error);
}

TEST(BF16, MatmulMatchesReferenceOnOddShapes) {
  kestrel::ThreadPool pool(2);
  for (auto [rows, cols, n] : std::vector<std::tuple<size_t, size_t, size_t>>{
           {1, 1, 1}, {7, 13, 3}, {33, 100, 6}, {64, 640, 2}, {40, 640, 9}}) {
    const auto wf = gaussian(rows * cols, 31);
    std::vector<uint16_t> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = kestrel::gguf::fp32_to_bf16(wf[i]);
    const auto x = gaussian(n * cols, 32);
    k::Matrix m{k::WeightType::kBF16, wb.data(), rows, cols};
    std::vector<float> y(n * rows), ref(n * rows);
    k::matmul(m, x.data(), n, cols, y.data(), rows, pool);
    k::matmul_reference(m, x.data(), n, cols, ref.data(), rows);
    // With 8+ tokens the activations may be rounded to bf16 too (bf16 dot products).
    const bool bf16 = n >= 8 && k::bf16_dot_available() && cols % 32 == 0;
    for (size_t t = 0; t < n; ++t) {
      for (size_t r = 0; r < rows; ++r) {
        double magnitude = 0;  // bf16 activations: each product off by at most 2^-9 relative
        for (size_t i = 0; i < cols; ++i) magnitude += std::fabs(wf[r * cols + i] * x[t * cols + i]);
        const double tol = bf16 ? magnitude / 256 : 1e-4 * std::sqrt(cols);
        EXPECT_NEAR(y[t * rows + r], ref[t * rows + r], tol) << "t=" << t << " r=" << r;
      }
    }
  }
}

TEST(W4, AffineGroupsReproduceA16LevelGrid) {
  // A group on an affine 16-level grid (as a Q4_K sub-block is: w = a * q - b) comes back to
  // fp16 precision; the symmetric form cannot represent it.
  kestrel::ThreadPool pool(1);
  const float a = 0.0123f, b = 0.031f;
  std::vector<float> w(32);
  for (size_t i = 0; i < w.size(); ++i) w[i] = a * static_cast<float>((i * 7) % 16) - b;
  const auto affine = q::quantize_w4(w.data(), 1, 32, 32, nullptr, true, pool);
  const auto symmetric = q::quantize_w4(w.data(), 1, 32, 32, nullptr, false, pool);
  EXPECT_LT(q::w4_rms_error(affine, w.data()), 2e-5);
  EXPECT_GT(q::w4_rms_error(symmetric, w.data()), 10 * q::w4_rms_error(affine, w.data()));
}

TEST(W4, ImportanceLowersTheErrorWhereItIsHigh) {
  // Weighting channel errors by activation statistics (llama.cpp imatrix) trades error on
  // unimportant channels for error on important ones: the weighted error must not grow.
  kestrel::ThreadPool pool(1);
  const size_t rows = 16, cols = 64;
  const auto w = gaussian(rows * cols, 41);
  std::vector<float> importance(cols, 1.0f);
  for (size_t i = 0; i < cols; i += 8) importance[i] = 100.0f;
  for (bool zp : {false, true}) {
    const auto plain = q::quantize_w4(w.data(), rows, cols, 32, nullptr, zp, pool);
    const auto aware = q::quantize_w4(w.data(), rows, cols, 32, importance.data(), zp, pool);
    auto weighted_error = [&](const q::W4Matrix& m) {
      std::vector<float> row(cols);
      double e = 0;
      for (size_t r = 0; r < rows; ++r) {
        k::matrix_row(m.view(), r, row.data());
        for (size_t i = 0; i < cols; ++i) e += importance[i] * (row[i] - w[r * cols + i]) * (row[i] - w[r * cols + i]);
      }
      return e;
    };
    EXPECT_LT(weighted_error(aware), weighted_error(plain)) << "zero points " << zp;
  }
}

TEST(BF16, DotProductGemmMatchesRoundedReference) {
  // gemm_bf16_block against float64 sums of the same bf16-rounded operands.
  if (!k::bf16_dot_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  const size_t rows = 9, cols = 96, n = 7;
  const auto wf = gaussian(rows * cols, 51), xf = gaussian(n * cols, 52);
  std::vector<uint16_t> w(wf.size()), x(xf.size());
  k::to_bf16(wf.data(), w.data(), w.size());
  k::to_bf16(xf.data(), x.data(), x.size());
  std::vector<float> y(n * (rows + 2), -1.0f);
  k::gemm_bf16_block(w.data(), rows, cols, x.data(), n, cols, y.data(), rows + 2, 1);
  for (size_t t = 0; t < n; ++t) {
    for (size_t r = 0; r < rows; ++r) {
      double ref = 0;
      for (size_t i = 0; i < cols; ++i) {
        ref += static_cast<double>(kestrel::gguf::bf16_to_fp32(w[r * cols + i])) *
               kestrel::gguf::bf16_to_fp32(x[t * cols + i]);
      }
      EXPECT_NEAR(y[t * (rows + 2) + 1 + r], ref, 1e-4) << "t=" << t << " r=" << r;
    }
    EXPECT_EQ(y[t * (rows + 2)], -1.0f);  // columns outside [row0, row0 + rows) untouched
  }
}

TEST(F16, MatmulMatchesReferenceForDecodeAndPrefill) {
  // fp16 rows are widened exactly to float32, so only float32 summation order differs.
  kestrel::ThreadPool pool(2);
  for (auto [rows, cols, n] : std::vector<std::tuple<size_t, size_t, size_t>>{
           {7, 13, 1}, {33, 100, 3}, {40, 640, 9}}) {
    const auto wf = gaussian(rows * cols, 61);
    std::vector<uint16_t> wh(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wh[i] = kestrel::gguf::fp32_to_fp16(wf[i]);
    const auto x = gaussian(n * cols, 62);
    k::Matrix m{k::WeightType::kF16, wh.data(), rows, cols};
    std::vector<float> y(n * rows), ref(n * rows);
    k::matmul(m, x.data(), n, cols, y.data(), rows, pool);
    k::matmul_reference(m, x.data(), n, cols, ref.data(), rows);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], ref[i], 1e-4 * std::sqrt(cols)) << i;
  }
}

TEST(W4Rows, BlocksOfRowsEqualTheWholeMatrixByteForByte) {
  // The builder's streamed path (dequantize a block of rows -> quantize -> write) against
  // quantize_w4 on the whole matrix, for BF16 and F32 sources, symmetric and affine groups,
  // with and without importance, and block sizes that do and do not divide the rows.
  kestrel::ThreadPool pool(2);
  const size_t rows = 23, cols = 96, group = 32;
  const auto wf = gaussian(rows * cols, 61);
  std::vector<uint16_t> bf16(wf.size());
  std::vector<float> bf16_values(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) {
    bf16[i] = kestrel::gguf::fp32_to_bf16(wf[i]);
    bf16_values[i] = kestrel::gguf::bf16_to_fp32(bf16[i]);
  }
  std::vector<float> importance(cols);
  for (size_t i = 0; i < cols; ++i) importance[i] = 0.5f + static_cast<float>(i % 7);
  struct Source {
    kestrel::gguf::TensorType type;
    std::span<const std::byte> bytes;
    const float* values;  // what the bytes hold, as float32
  };
  const Source sources[] = {
      {kestrel::gguf::TensorType::kBF16, std::as_bytes(std::span(bf16)), bf16_values.data()},
      {kestrel::gguf::TensorType::kF32, std::as_bytes(std::span(wf)), wf.data()}};
  for (const auto& src : sources) {
    for (bool zp : {false, true}) {
      for (const float* imp : {static_cast<const float*>(nullptr), static_cast<const float*>(importance.data())}) {
        const auto whole = q::quantize_w4(src.values, rows, cols, group, imp, zp, pool);
        for (size_t block : {size_t{1}, size_t{4}, size_t{7}, rows, rows + 5}) {
          std::vector<uint8_t> codes;
          size_t calls = 0;
          const auto groups = q::quantize_w4_rows(
              src.type, src.bytes, rows, cols, group, imp, zp, block,
              [&](std::span<const uint8_t> c) {
                EXPECT_LE(c.size(), block * cols / 2);
                codes.insert(codes.end(), c.begin(), c.end());
                ++calls;
              },
              pool);
          EXPECT_EQ(calls, (rows + block - 1) / block);
          EXPECT_EQ(codes, whole.qs) << "block " << block << " zp " << zp;
          EXPECT_EQ(groups.scales, whole.scales) << "block " << block << " zp " << zp;
          EXPECT_EQ(groups.mins, whole.mins) << "block " << block << " zp " << zp;
          EXPECT_EQ(groups.mins.size(), zp ? rows * cols / group : 0u);
        }
        if (!zp) continue;
        // scale_bits 8: the block-wise compression equals compressing the whole matrix.
        auto whole8 = whole;
        q::compress_group_params(whole8, src.values, imp, pool);
        for (size_t block : {size_t{1}, size_t{7}, rows}) {
          std::vector<uint8_t> codes;
          const auto groups = q::quantize_w4_rows(
              src.type, src.bytes, rows, cols, group, imp, zp, block,
              [&](std::span<const uint8_t> c) { codes.insert(codes.end(), c.begin(), c.end()); }, pool, 8);
          EXPECT_EQ(codes, whole8.qs) << "block " << block;
          EXPECT_NE(codes, whole.qs) << "block " << block;  // codes are re-rounded on the 8-bit grid
          EXPECT_TRUE(groups.scales.empty());
          EXPECT_EQ(groups.scales8, whole8.scales8) << "block " << block;
          EXPECT_EQ(groups.mins8, whole8.mins8) << "block " << block;
          EXPECT_EQ(groups.row_scales, whole8.row_scales) << "block " << block;
        }
      }
    }
  }
}

TEST(W4Rows, RefusesBadArguments) {
  kestrel::ThreadPool pool(1);
  std::vector<uint16_t> bf16(4 * 64);
  const auto bytes = std::as_bytes(std::span(bf16));
  const auto sink = [](std::span<const uint8_t>) {};
  using kestrel::gguf::TensorType;
  EXPECT_THROW(q::quantize_w4_rows(TensorType::kBF16, bytes, 4, 64, 32, nullptr, true, 0, sink, pool),
               kestrel::Error);  // no rows per block
  EXPECT_THROW(q::quantize_w4_rows(TensorType::kBF16, bytes, 5, 64, 32, nullptr, true, 2, sink, pool),
               kestrel::Error);  // too few bytes
  EXPECT_THROW(q::quantize_w4_rows(TensorType::kBF16, bytes, 4, 64, 48, nullptr, true, 2, sink, pool),
               kestrel::Error);  // group size
  EXPECT_THROW(q::quantize_w4_rows(TensorType::kBF16, bytes, 4, 64, 32, nullptr, false, 2, sink, pool, 8),
               kestrel::Error);  // 8-bit scales of symmetric groups
  EXPECT_THROW(q::quantize_w4_rows(TensorType::kBF16, bytes, 4, 64, 32, nullptr, true, 2, sink, pool, 4),
               kestrel::Error);  // 4-bit scales
}

TEST(W4Scales8, StoredFieldsDecodeAsDocumentedAndCostLittleAccuracy) {
  // The 8-bit form read back from its raw fields by the formula of kernels/matmul.h
  // (d_g = d_row s_g, m_g = -m_row n_g), independently of matrix_row; and its error against the
  // source weights stays within a few percent of the fp16 form's. Rows with one large-scale
  // group (an outlier channel) are the hard case for one fp16 pair per row.
  kestrel::ThreadPool pool(2);
  const size_t rows = 24, cols = 640, group = 32, n_groups = cols / group;
  auto w = gaussian(rows * cols, 71);
  for (size_t r = 0; r < rows; r += 3) {
    for (size_t i = 0; i < group; ++i) w[r * cols + 5 * group + i] *= 12.0f;
  }
  const auto fp16 = q::quantize_w4(w.data(), rows, cols, group, nullptr, true, pool);
  auto q8 = fp16;
  q::compress_group_params(q8, w.data(), nullptr, pool);
  EXPECT_TRUE(q8.scales.empty());
  EXPECT_TRUE(q8.mins.empty());
  ASSERT_EQ(q8.scales8.size(), rows * n_groups);
  ASSERT_EQ(q8.mins8.size(), rows * n_groups);
  ASSERT_EQ(q8.row_scales.size(), rows * 2);
  std::vector<float> row(cols);
  double err8 = 0, err16 = 0;
  size_t max_s = 0, max_n = 0;
  for (size_t r = 0; r < rows; ++r) {
    k::matrix_row(q8.view(), r, row.data());
    const double d_row = kestrel::gguf::fp16_to_fp32(q8.row_scales[2 * r]);
    const double m_row = kestrel::gguf::fp16_to_fp32(q8.row_scales[2 * r + 1]);
    for (size_t i = 0; i < cols; ++i) {
      const size_t g = i / group, j = i % group;
      const uint8_t byte = q8.qs[r * cols / 2 + g * group / 2 + j % (group / 2)];
      const int code = j < group / 2 ? byte & 0x0F : byte >> 4;
      const double expected =
          d_row * q8.scales8[r * n_groups + g] * code - m_row * q8.mins8[r * n_groups + g];
      ASSERT_NEAR(row[i], expected, 1e-5 * (std::fabs(expected) + 1)) << "r=" << r << " i=" << i;
      err8 += (row[i] - w[r * cols + i]) * (row[i] - w[r * cols + i]);
    }
    for (size_t g = 0; g < n_groups; ++g) {
      max_s = std::max<size_t>(max_s, q8.scales8[r * n_groups + g]);
      max_n = std::max<size_t>(max_n, q8.mins8[r * n_groups + g]);
    }
  }
  EXPECT_GE(max_s, 250u);  // the row scale is set by the largest group: its s_g is ~255
  EXPECT_GE(max_n, 250u);
  err16 = q::w4_rms_error(fp16, w.data());
  err8 = std::sqrt(err8 / static_cast<double>(rows * cols));
  EXPECT_NEAR(err8, q::w4_rms_error(q8, w.data()), 1e-9);
  EXPECT_LT(err8, 1.06 * err16) << "fp16 " << err16 << " 8-bit " << err8;
  EXPECT_GT(err8, 0.9 * err16);  // not a copy of the fp16 form
}

TEST(W4Scales8, SliceAndRefusals) {
  kestrel::ThreadPool pool(1);
  const size_t rows = 9, cols = 256;
  const auto w = gaussian(rows * cols, 72);
  auto q8 = q::quantize_w4(w.data(), rows, cols, 64, nullptr, true, pool);
  q::compress_group_params(q8, w.data(), nullptr, pool);
  const auto slice = k::row_slice(q8.view(), 4, 3);
  std::vector<float> a(cols), b(cols);
  for (size_t r = 0; r < 3; ++r) {
    k::matrix_row(slice, r, a.data());
    k::matrix_row(q8.view(), 4 + r, b.data());
    EXPECT_EQ(a, b);
  }
  EXPECT_THROW(q::compress_group_params(q8, w.data(), nullptr, pool), kestrel::Error);
  auto symmetric = q::quantize_w4(w.data(), rows, cols, 64, nullptr, false, pool);
  EXPECT_THROW(q::compress_group_params(symmetric, w.data(), nullptr, pool), kestrel::Error);
  k::Matrix broken = q8.view();
  broken.row_scales = nullptr;
  std::vector<float> x(cols, 1.0f), y(rows);
  EXPECT_THROW(k::matmul(broken, x.data(), 1, cols, y.data(), rows, pool), kestrel::Error);
}
