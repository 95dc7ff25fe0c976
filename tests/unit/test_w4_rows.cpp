// The row-major int8 kernel for INT4 matrices (kernels/gemv_w4_rows.h): every path this CPU
// runs writes, for every token range and row range, exactly the bits of gemv_w4_int8's portable
// path on an interleaved copy of the same matrix where that copy takes 32-column blocks (not its
// superblocks for 8-bit parameters), and of the header's float32 steps written out
// here from the codes and parameters (for row counts the copy does not take too); the float64
// sum of the formula bounds both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/gemv_w4_rows.h"
#include "random_w4.h"

namespace k = kestrel::kernels;

namespace {

using kestrel::testing::activations;
using kestrel::testing::Params;
using kestrel::testing::RandomW4;

// The header's steps for row r and token t, from the codes and parameters as matmul.h defines
// them; *magnitude gets the float64 sum of the terms' sizes and *exact their float64 sum.
float stated_steps(const RandomW4& w, const k::Q8Activations& xq, size_t t, size_t r, double* exact,
                   double* magnitude) {
  const size_t nb = w.cols / 32;
  float acc = 0.0f, macc = 0.0f;
  *exact = *magnitude = 0.0;
  for (size_t b = 0; b < nb; ++b) {
    float d, m;
    w.params(r, b * 32 / w.group_size, d, m);
    int32_t dot = 0;
    for (size_t i = 0; i < 32; ++i) dot += w.code(r, b * 32 + i) * xq.q[t * w.cols + b * 32 + i];
    const float xd = xq.scale[t * nb + b];
    const int32_t sum = xq.sum128[t * nb + b] / 128;
    acc = std::fma(static_cast<float>(dot), d * xd, acc);
    macc = std::fma(m, static_cast<float>(sum) * xd, macc);
    const double terms[] = {static_cast<double>(dot) * d * xd, static_cast<double>(m) * sum * xd};
    for (double v : terms) *exact += v, *magnitude += std::fabs(v);
  }
  return acc + macc;
}

TEST(W4Int8Rows, EveryPathWritesTheInterleavedKernelsBits) {
  const std::vector<std::tuple<size_t, size_t, size_t>> shapes = {
      {8, 32, 32}, {16, 640, 32}, {37, 256, 64}, {32, 512, 128}, {64, 2560, 32}, {16, 160, 32}};
  for (auto [rows, cols, G] : shapes) {
    for (Params p : {Params::kSymmetric16, Params::kAffine16, Params::kAffine8, Params::kSymmetric8}) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " group " + std::to_string(G) +
                   " params " + std::to_string(static_cast<int>(p)));
      const RandomW4 w(rows, cols, G, p, 7 * rows + cols + static_cast<uint64_t>(p));
      const k::Matrix m = w.view();
      const size_t n = 5;
      const auto x = activations(n, cols, rows);
      k::Q8Activations xq;
      k::quantize_q8_activations(x.data(), n, cols, cols, xq);
      std::vector<float> expected(n * rows);
      for (size_t t = 0; t < n; ++t) {
        for (size_t r = 0; r < rows; ++r) {
          double exact = 0, magnitude = 0;
          expected[t * rows + r] = stated_steps(w, xq, t, r, &exact, &magnitude);
          ASSERT_NEAR(expected[t * rows + r], exact, 1e-5 * magnitude + 1e-30) << "t=" << t << " r=" << r;
        }
      }
      // The interleaved copy's kernel: the same bits where it also rounds per 32 columns (not on
      // its superblocks of 128 for 8-bit parameters).
      if (rows % 16 == 0 && !k::w4_int8_superblocks(k::interleave_w4_int8(m))) {
        std::vector<float> interleaved(n * rows);
        k::gemv_w4_int8_scalar(k::interleave_w4_int8(m), x.data(), n, cols, interleaved.data(), rows, 0, rows);
        ASSERT_EQ(std::memcmp(interleaved.data(), expected.data(), expected.size() * sizeof(float)), 0);
      }
      for (k::Int8Isa isa : k::int8_isas_available()) {
        SCOPED_TRACE(k::int8_isa_name(isa));
        // Row ranges that cut the 8-row passes, token ranges that skip the first tokens.
        for (auto [r0, r1] : std::vector<std::pair<size_t, size_t>>{{0, rows}, {3, rows}, {1, rows - 1}, {rows - 1, rows}}) {
          for (auto [t0, t1] : std::vector<std::pair<size_t, size_t>>{{0, n}, {2, 3}, {4, 5}}) {
            std::vector<float> y((t1 - t0) * rows, -1.0f);
            k::gemv_w4_rows_on(isa, m, xq, t0, t1, y.data(), rows, r0, r1);
            for (size_t t = t0; t < t1; ++t) {
              for (size_t r = 0; r < rows; ++r) {
                const float got = y[(t - t0) * rows + r];
                if (r < r0 || r >= r1) {
                  ASSERT_EQ(got, -1.0f) << "wrote outside its rows";
                } else {
                  ASSERT_EQ(std::memcmp(&got, &expected[t * rows + r], sizeof got), 0)
                      << "t=" << t << " r=" << r << " rows " << r0 << ".." << r1 << ": " << got << " vs "
                      << expected[t * rows + r];
                }
              }
            }
          }
        }
      }
    }
  }
  if (k::int8_isas_available().size() == 1) GTEST_SKIP() << "checked the portable path only: no AVX2 or AVX512-VNNI";
}

// matmul runs a matrix marked int8_rows through this kernel for every token count (rows split
// over the threads for decode, tokens for prefill chunks): each token's products are its bits.
TEST(W4Int8Rows, MatmulUsesItForEveryTokenCount) {
  const size_t rows = 40, cols = 512;
  const RandomW4 w(rows, cols, 64, Params::kAffine8, 3);
  k::Matrix m = w.view();
  m.int8_rows = true;
  const size_t n_max = 70;
  const auto x = activations(n_max, cols, 4);
  kestrel::ThreadPool pool(3);
  for (size_t n : {1, 2, 7, 8, 13, 70}) {
    k::Q8Activations xq;
    k::quantize_q8_activations(x.data(), n, cols, cols, xq);
    std::vector<float> direct(n * rows), via_matmul(n * rows), one_row(n);
    k::gemv_w4_rows(w.view(), xq, 0, n, direct.data(), rows, 0, rows);
    k::matmul(m, x.data(), n, cols, via_matmul.data(), rows, pool);
    EXPECT_EQ(std::memcmp(direct.data(), via_matmul.data(), direct.size() * sizeof(float)), 0) << n << " tokens";
    k::matmul_rows(k::row_slice(m, 17, 1), x.data(), n, cols, one_row.data(), 1, 0, 1);
    for (size_t t = 0; t < n; ++t) EXPECT_EQ(one_row[t], direct[t * rows + 17]) << n << " tokens, token " << t;
  }
}

TEST(W4Int8Rows, BadArgumentsAreErrors) {
  const RandomW4 w(16, 64, 32, Params::kAffine16, 3);
  const k::Matrix m = w.view();
  k::Q8Activations xq;
  k::quantize_q8_activations(std::vector<float>(64, 1.0f).data(), 1, 64, 64, xq);
  std::vector<float> y(32);
  EXPECT_NO_THROW(k::gemv_w4_rows(m, xq, 0, 1, y.data(), 16, 0, 16));
  EXPECT_THROW(k::gemv_w4_rows(m, xq, 0, 1, y.data(), 16, 0, 17), kestrel::Error);  // past the rows
  EXPECT_THROW(k::gemv_w4_rows(m, xq, 0, 2, y.data(), 16, 0, 16), kestrel::Error);  // past the tokens
  k::Q8Activations narrow;
  k::quantize_q8_activations(std::vector<float>(32, 1.0f).data(), 1, 32, 32, narrow);
  EXPECT_THROW(k::gemv_w4_rows(m, narrow, 0, 1, y.data(), 16, 0, 16), kestrel::Error);  // 32 vs 64 columns
  k::Matrix no_params = m;
  no_params.scales = nullptr;
  EXPECT_FALSE(k::w4_rows_supported(no_params));
  EXPECT_THROW(k::gemv_w4_rows(no_params, xq, 0, 1, y.data(), 16, 0, 16), kestrel::Error);
  for (k::Int8Isa isa : {k::Int8Isa::kAvx2, k::Int8Isa::kAvx512Vnni}) {
    if (k::int8_isa_available(isa)) continue;
    EXPECT_THROW(k::gemv_w4_rows_on(isa, m, xq, 0, 1, y.data(), 16, 0, 16), kestrel::Error) << k::int8_isa_name(isa);
  }
}

}  // namespace
