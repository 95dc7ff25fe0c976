// The int8-activation INT4 decode kernel (kernels/gemv_w4_int8.h): equal to a float64 sum of
// the formula its header states, for 32-column blocks and for superblocks of 128 (8-bit group
// parameters) (activations quantized here independently; the integer dot products are exact,
// so only float32 rounding separates them);
// every SIMD path (int8_isa.h) agrees with the portable one bit for bit; each token's result is the same whatever the token count (1..7) and
// row range; and against float64 W x of the dequantized weights the error stays within the
// activations' rounding bound, sum_b (d_xb / 2) sum_{i in b} |w_i|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/gemm_w4_amx_bf16.h"
#include "kestrel/kernels/gemm_w8a8.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/kernel_options.h"
#include "kestrel/quant/w4.h"
#include "random_q8.h"
#include "random_w4.h"

namespace k = kestrel::kernels;

namespace {

using kestrel::testing::activations;
using kestrel::testing::Params;
using kestrel::testing::RandomW4;

// A W4Int8Interleaved array's values (its spans view the copy's storage or an image's tensors),
// for comparisons that print them.
template <typename T>
std::vector<T> values(std::span<const T> s) {
  return {s.begin(), s.end()};
}

// The activation quantization the header states, written here independently: per block of
// `block` columns (32, or the superblocks' 128) d_x and the block's sum S of the int8 values.
struct Quantized {
  std::vector<int> q;         // [cols]
  std::vector<double> d, s;   // [cols / block]: d_xb, S_b
};
Quantized quantize(const float* x, size_t cols, size_t block = 32) {
  Quantized out;
  out.q.resize(cols);
  for (size_t b = 0; b < cols / block; ++b) {
    float amax = 0.0f;
    for (size_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b * block + i]));
    const float d = amax / 127.0f;
    int sum = 0;
    for (size_t i = 0; i < block; ++i) {
      const int q = d > 0.0f ? static_cast<int>(std::nearbyint(x[b * block + i] / d)) : 0;
      out.q[b * block + i] = q;
      sum += q;
    }
    out.d.push_back(d);
    out.s.push_back(sum);
  }
  return out;
}

// What the header's formula gives for row r and token x (float64 sums of exact integers), with
// the float32 rounding's scale (`magnitude`), float64 W x, and the activations' rounding bound.
struct Expected {
  double formula = 0, magnitude = 0, wx = 0, rounding = 0;
  size_t float_steps = 0;
};
Expected expected_blocks(const RandomW4& w, size_t r, size_t G, const float* x) {
  const size_t cols = w.cols;
  const Quantized xq = quantize(x, cols);
  Expected e;
  for (size_t b = 0; b < cols / 32; ++b) {
    float d, m;
    w.params(r, b * 32 / G, d, m);
    long dot = 0;
    double wabs = 0;
    for (size_t c = b * 32; c < (b + 1) * 32; ++c) {
      dot += static_cast<long>(w.code(r, c)) * xq.q[c];
      const double wv = static_cast<double>(d) * w.code(r, c) + m;
      e.wx += wv * x[c];
      wabs += std::fabs(wv);
    }
    const double main = static_cast<double>(d) * xq.d[b] * static_cast<double>(dot);
    const double offset = static_cast<double>(m) * xq.d[b] * xq.s[b];
    e.formula += main + offset;
    e.magnitude += std::fabs(main) + std::fabs(offset);
    e.rounding += xq.d[b] / 2 * wabs;
  }
  e.float_steps = 2 * (cols / 32) + 4;  // per block two products and two fmas, then the sum
  return e;
}
// Superblocks: per 128 columns d_x * sum_g (d_g D_g + m_g S_g), d_g = d_row * s_g and
// m_g = -m_row * n_g (RandomW4::params gives their float32 products, a 2^-24 step from the
// kernel's exact integers times d_row, m_row).
Expected expected_superblocks(const RandomW4& w, size_t r, size_t G, const float* x) {
  const size_t cols = w.cols;
  const Quantized xq = quantize(x, cols, 128);
  Expected e;
  for (size_t k = 0; k < cols / 128; ++k) {
    double wabs = 0;
    for (size_t g = k * 128 / G; g < (k + 1) * 128 / G; ++g) {
      float d, m;
      w.params(r, g, d, m);
      long dot = 0, sum = 0;
      for (size_t c = g * G; c < (g + 1) * G; ++c) {
        dot += static_cast<long>(w.code(r, c)) * xq.q[c];
        sum += xq.q[c];
        const double wv = static_cast<double>(d) * w.code(r, c) + m;
        e.wx += wv * x[c];
        wabs += std::fabs(wv);
      }
      const double main = static_cast<double>(d) * xq.d[k] * static_cast<double>(dot);
      const double offset = static_cast<double>(m) * xq.d[k] * static_cast<double>(sum);
      e.formula += main + offset;
      e.magnitude += std::fabs(main) + std::fabs(offset);
    }
    e.rounding += xq.d[k] / 2 * wabs;
  }
  // per superblock two conversions of integers past 2^24 and two fmas; d_g, m_g; the last step
  e.float_steps = 4 * (cols / 128) + 8;
  return e;
}

const std::vector<std::tuple<size_t, size_t, size_t>> kShapes = {
    {16, 32, 32}, {32, 640, 32}, {48, 256, 64}, {32, 512, 128}, {64, 2560, 32},
    // 8-bit parameters on 32-column blocks: cols not a multiple of 128, groups not dividing 128
    {16, 160, 32}, {16, 384, 96}, {16, 512, 256}};
const Params kAll[] = {Params::kSymmetric16, Params::kAffine16, Params::kAffine8, Params::kSymmetric8};

TEST(W4Int8, EqualsTheStatedFormulaAndIsWithinTheActivationRoundingOfWx) {
  for (auto [rows, cols, G] : kShapes) {
    for (Params p : kAll) {
      const RandomW4 w(rows, cols, G, p, rows * 7 + cols + static_cast<uint64_t>(p));
      const k::W4Int8Interleaved il = k::interleave_w4_int8(w.view());
      const size_t n = 7;
      const auto x = activations(n, cols, rows + 11 * cols);
      std::vector<float> y(n * rows);
      k::gemv_w4_int8(il, x.data(), n, cols, y.data(), rows, 0, rows);
      const bool super = k::w4_int8_superblocks(il);
      // 8-bit parameters on superblocks exactly where cols is a multiple of 128.
      ASSERT_EQ(super, (p == Params::kAffine8 || p == Params::kSymmetric8) && cols % 128 == 0 && 128 % G == 0);
      for (size_t t = 0; t < n; ++t) {
        for (size_t r = 0; r < rows; ++r) {
          const Expected e = super ? expected_superblocks(w, r, G, &x[t * cols]) : expected_blocks(w, r, G, &x[t * cols]);
          const double formula = e.formula, wx = e.wx, rounding = e.rounding;
          const double f32 = static_cast<double>(e.float_steps) * 0x1p-24 * e.magnitude + 1e-30;
          const float got = y[t * rows + r];
          ASSERT_LE(std::fabs(got - formula), f32)
              << "formula: rows " << rows << " cols " << cols << " G " << G << " params " << static_cast<int>(p)
              << " token " << t << " row " << r;
          ASSERT_LE(std::fabs(got - wx), rounding * (1 + 1e-6) + f32)
              << "W x: rows " << rows << " cols " << cols << " G " << G << " token " << t << " row " << r;
        }
      }
    }
  }
}

TEST(W4Int8, EverySimdPathAgreesWithThePortableBitForBit) {
  std::vector<k::Int8Isa> simd;
  for (k::Int8Isa isa : k::int8_isas_available()) {
    if (isa != k::Int8Isa::kPortable) simd.push_back(isa);
  }
  if (simd.empty()) GTEST_SKIP() << "this CPU has no AVX2 or AVX512-VNNI: gemv_w4_int8 is the portable path";
  for (k::Int8Isa isa : simd) {
  SCOPED_TRACE(k::int8_isa_name(isa));
  for (auto [rows, cols, G] : kShapes) {
    for (Params p : kAll) {
      const RandomW4 w(rows, cols, G, p, rows + cols * 3 + static_cast<uint64_t>(p));
      const k::W4Int8Interleaved il = k::interleave_w4_int8(w.view());
      // Decode rows, and prefill chunks past the 4-token (AVX2) and 8-token (AVX512-VNNI)
      // tiles: whole and partial tiles.
      for (size_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 21}) {
        const auto x = activations(n, cols, n * 5 + rows);
        std::vector<float> fast(n * rows), portable(n * rows);
        k::gemv_w4_int8_on(isa, il, x.data(), n, cols, fast.data(), rows, 0, rows);
        k::gemv_w4_int8_scalar(il, x.data(), n, cols, portable.data(), rows, 0, rows);
        ASSERT_EQ(std::memcmp(fast.data(), portable.data(), fast.size() * sizeof(float)), 0)
            << "rows " << rows << " cols " << cols << " G " << G << " params " << static_cast<int>(p) << " tokens "
            << n;
      }
    }
  }
  }
}

TEST(W4Int8, EachTokenIsTheSameWhateverTheTokenCountAndRowRange) {
  const size_t rows = 64, cols = 640, n_max = 13;  // decode rows and prefill chunks
  for (Params p : kAll) {
    const RandomW4 w(rows, cols, 32, p, 99 + static_cast<uint64_t>(p));
    const k::W4Int8Interleaved il = k::interleave_w4_int8(w.view());
    const auto x = activations(n_max, cols, 5);
    for (k::Int8Isa isa : k::int8_isas_available()) {
      const char* path = k::int8_isa_name(isa);
      auto run = [&](const float* xs, size_t n, float* y, size_t y_stride, size_t lo, size_t hi) {
        k::gemv_w4_int8_on(isa, il, xs, n, cols, y, y_stride, lo, hi);
      };
      // Two references: the 13-token call (prefill: the W8A8 copy where the matrix has one) and
      // each token alone (decode: the INT4 codes).
      std::vector<float> prefill(n_max * rows), decode(n_max * rows);
      run(x.data(), n_max, prefill.data(), rows, 0, rows);
      for (size_t t = 0; t < n_max; ++t) run(&x[t * cols], 1, &decode[t * rows], rows, 0, rows);
      for (size_t n = 1; n <= n_max; ++n) {
        const std::vector<float>& all = n >= k::kTileMinTokens ? prefill : decode;
        for (size_t first = 0; first + n <= n_max; first += 2) {
          for (auto [lo, hi] : std::vector<std::pair<size_t, size_t>>{{0, rows}, {5, 61}, {16, 32}, {17, 18}}) {
            std::vector<float> y(n * rows, -1.0f);
            run(&x[first * cols], n, y.data(), rows, lo, hi);
            for (size_t t = 0; t < n; ++t) {
              for (size_t r = 0; r < rows; ++r) {
                if (r < lo || r >= hi) {
                  ASSERT_EQ(y[t * rows + r], -1.0f) << "wrote outside the row range";
                  continue;
                }
                uint32_t a, b;
                std::memcpy(&a, &y[t * rows + r], 4);
                std::memcpy(&b, &all[(first + t) * rows + r], 4);
                ASSERT_EQ(a, b) << "params " << static_cast<int>(p) << " path " << path << " tokens " << n
                                << " first " << first << " rows [" << lo << ", " << hi << ") row " << r;
              }
            }
          }
        }
      }
    }
  }
}

// matmul runs a matrix carrying the int8 copy (as an int8 load holds it) through gemv_w4_int8
// for every token count: decode rows split over the threads by rows, prefill chunks (from
// 4 tokens a thread) by tokens; each token's products are the kernel's bits either way, and
// differ from the row-major (bf16 / float32) kernels' that a matrix without the copy takes.
// With KESTREL_AMX=1 on a CPU with AMX-BF16, products of kTileMinTokens tokens or more take its tiles instead
// (gemm_w4_amx_bf16.h), with their bits, however the threads split them.
TEST(W4Int8, MatmulUsesTheInt8CopyForEveryTokenCount) {
  const size_t rows = 64, cols = 640;
  for (Params p : {Params::kAffine16, Params::kAffine8}) {  // 32-column blocks, superblocks
  SCOPED_TRACE(static_cast<int>(p));
  const RandomW4 w(rows, cols, 32, p, 21);
  const k::W4Int8Interleaved il = k::interleave_w4_int8(w.view());
  k::Matrix m = w.view();
  m.interleaved_int8 = &il;
  const size_t n_max = 800;  // past two chunks of a thread's share (64 tokens; 256 with AMX-BF16)
  const auto x = activations(n_max, cols, 8);
  kestrel::ThreadPool pool(3);
  for (size_t n : {1, 2, 4, 7, 8, 11, 12, 13, 40, 63, 64, 150, 800}) {
    std::vector<float> via_matmul(n * rows), same_input(n * rows), plain(n * rows), row_major(n * rows);
    k::matmul(m, x.data(), n, cols, via_matmul.data(), rows, pool);
    const k::MatmulOutput outs[] = {{&m, same_input.data(), rows}};
    k::matmul_same_input(outs, x.data(), n, cols, pool);
    k::matmul(w.view(), x.data(), n, cols, row_major.data(), rows, pool);
    if (n >= k::kTileMinTokens && k::amx_prefill_enabled()) {
      k::gemm_w4_amx_bf16(il, x.data(), n, cols, plain.data(), rows, 0, rows);
    } else {
      k::gemv_w4_int8(il, x.data(), n, cols, plain.data(), rows, 0, rows);
    }
    EXPECT_EQ(std::memcmp(via_matmul.data(), plain.data(), plain.size() * sizeof(float)), 0) << n << " tokens";
    EXPECT_EQ(std::memcmp(same_input.data(), plain.data(), plain.size() * sizeof(float)), 0) << n << " tokens";
    EXPECT_NE(std::memcmp(row_major.data(), plain.data(), plain.size() * sizeof(float)), 0)
        << n << " tokens: the row-major kernels round the activations otherwise";
  }
  }
}

// The W8A8 prefill copy (gemm_w8a8.h, opt-in: built here by requantize_w8) of matrices with
// 8-bit group parameters on superblocks: chunks of kTileMinTokens tokens or more give exactly the
// header's formula, computed here from
// the dequantized rows (matrix_row) with this file's own activation quantizer, and stay within
// the two roundings' bound of float64 W x: sum_k (d_xk / 2) sum |v R| + sum (R / 2) |x|.
TEST(W8A8, PrefillChunksGiveTheStatedFormulaAndStayWithinBothRoundingsOfWx) {
  const std::vector<std::tuple<size_t, size_t, size_t>> shapes = {
      {16, 128, 32}, {32, 640, 64}, {48, 2560, 128}, {16, 384, 64}};
  for (auto [rows, cols, G] : shapes) {
    for (Params p : {Params::kAffine8, Params::kSymmetric8}) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + " G " + std::to_string(G));
      const RandomW4 w(rows, cols, G, p, rows * 5 + cols + static_cast<uint64_t>(p));
      k::W4Int8Interleaved il = k::interleave_w4_int8(w.view());
      k::requantize_w8(w.view(), il);
      const size_t n = 11;
      const auto x = activations(n, cols, rows + 3 * cols);
      std::vector<float> y(n * rows);
      k::gemv_w4_int8(il, x.data(), n, cols, y.data(), rows, 0, rows);
      std::vector<float> row(cols);
      for (size_t r = 0; r < rows; ++r) {
        k::matrix_row(w.view(), r, row.data());
        float amax = 0.0f;
        for (float v : row) amax = std::max(amax, std::fabs(v));
        const float scale = amax / 127.0f;
        std::vector<int> v(cols);
        for (size_t c = 0; c < cols; ++c) v[c] = scale > 0.0f ? static_cast<int>(std::nearbyint(row[c] / scale)) : 0;
        for (size_t t = 0; t < n; ++t) {
          const float* xt = &x[t * cols];
          const Quantized xq = quantize(xt, cols, 128);
          float acc = 0.0f;
          double wx = 0, bound = 0;
          for (size_t kb = 0; kb < cols / 128; ++kb) {
            long dot = 0;
            double vabs = 0;
            for (size_t c = kb * 128; c < (kb + 1) * 128; ++c) {
              dot += static_cast<long>(v[c]) * xq.q[c];
              vabs += std::fabs(v[c] * static_cast<double>(scale));
              float d, m;
              w.params(r, c / G, d, m);
              wx += (static_cast<double>(d) * w.code(r, c) + m) * xt[c];
              bound += static_cast<double>(scale) / 2 * std::fabs(xt[c]);
            }
            acc = std::fma(static_cast<float>(dot), static_cast<float>(xq.d[kb]), acc);
            bound += xq.d[kb] / 2 * vabs;
          }
          const float formula = scale * acc;
          uint32_t got_bits, want_bits;
          std::memcpy(&got_bits, &y[t * rows + r], 4);
          std::memcpy(&want_bits, &formula, 4);
          ASSERT_EQ(got_bits, want_bits) << "params " << static_cast<int>(p) << " token " << t << " row " << r;
          ASSERT_LE(std::fabs(formula - wx), bound * (1 + 1e-6) + 1e-5 * std::fabs(wx) + 1e-30)
              << "token " << t << " row " << r;
        }
      }
    }
  }
}

// A product's token split over threads (4-token shares) gives the whole product's bits: the
// choice of the W8A8 copy follows product_tokens, not the share.
TEST(W8A8, SharesOfAPrefillProductTakeTheCopy) {
  const size_t rows = 32, cols = 256;
  const RandomW4 w(rows, cols, 64, Params::kAffine8, 5);
  k::W4Int8Interleaved il = k::interleave_w4_int8(w.view());
  k::requantize_w8(w.view(), il);
  const size_t n = 12;
  const auto x = activations(n, cols, 2);
  std::vector<float> whole(n * rows), shares(n * rows), alone(n * rows);
  k::gemv_w4_int8(il, x.data(), n, cols, whole.data(), rows, 0, rows);
  for (size_t t0 = 0; t0 < n; t0 += 4) {
    k::gemv_w4_int8(il, &x[t0 * cols], 4, cols, &shares[t0 * rows], rows, 0, rows, n);
    k::gemv_w4_int8(il, &x[t0 * cols], 4, cols, &alone[t0 * rows], rows, 0, rows);
  }
  EXPECT_EQ(std::memcmp(whole.data(), shares.data(), whole.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(whole.data(), alone.data(), whole.size() * sizeof(float)), 0)
      << "4-token calls of their own are decode-sized: the INT4 codes, other bits";
}

TEST(W8A8, EverySimdPathAgreesWithThePortableBitForBit) {
  kestrel::ThreadPool pool(3);
  for (auto [rows, cols, G] : std::vector<std::tuple<size_t, size_t, size_t>>{{16, 128, 32}, {48, 640, 64}, {32, 2560, 128}}) {
    for (Params p : {Params::kAffine8, Params::kSymmetric8}) {
      const RandomW4 w(rows, cols, G, p, rows + cols + static_cast<uint64_t>(p));
      k::W4Int8Interleaved il = k::interleave_w4_int8(w.view());
      k::requantize_w8(w.view(), il, &pool);
      k::W4Int8Interleaved one = k::interleave_w4_int8(w.view());
      k::requantize_w8(w.view(), one);
      ASSERT_EQ(values(il.w8), values(one.w8)) << "requantizing over a pool";
      ASSERT_EQ(values(il.w8_scale), values(one.w8_scale));
      // Whole and partial 8-token (VNNI) and 4-token (AVX2) tiles, a row range inside a block.
      for (size_t n : {8, 9, 13, 16, 21, 70}) {
        const auto x = activations(n, cols, n + rows);
        std::vector<float> portable(n * rows);
        k::gemv_w4_int8_scalar(il, x.data(), n, cols, portable.data(), rows, 0, rows);
        for (k::Int8Isa isa : k::int8_isas_available()) {
          std::vector<float> fast(n * rows, -1.0f);
          k::gemv_w4_int8_on(isa, il, x.data(), n, cols, fast.data(), rows, 3, rows - 2);
          for (size_t t = 0; t < n; ++t) {
            for (size_t r = 0; r < rows; ++r) {
              const float want = r < 3 || r >= rows - 2 ? -1.0f : portable[t * rows + r];
              ASSERT_EQ(std::memcmp(&fast[t * rows + r], &want, 4), 0)
                  << k::int8_isa_name(isa) << " rows " << rows << " cols " << cols << " tokens " << n << " token " << t
                  << " row " << r;
            }
          }
        }
      }
    }
  }
}

TEST(W4Int8, InterleavingOverAThreadPoolGivesTheSameCopy) {
  kestrel::ThreadPool pool(3);
  for (auto [rows, cols, G] : kShapes) {
    for (Params p : kAll) {
      const RandomW4 w(rows, cols, G, p, rows + 3 * cols + static_cast<uint64_t>(p));
      const k::W4Int8Interleaved one = k::interleave_w4_int8(w.view());
      const k::W4Int8Interleaved three = k::interleave_w4_int8(w.view(), &pool);
      EXPECT_EQ(values(one.codes), values(three.codes));
      EXPECT_EQ(values(one.scales), values(three.scales));
      EXPECT_EQ(values(one.mins), values(three.mins));
      EXPECT_EQ(values(one.scales8), values(three.scales8));
      EXPECT_EQ(values(one.mins8), values(three.mins8));
      EXPECT_EQ(values(one.row_d), values(three.row_d));
      EXPECT_EQ(values(one.row_m), values(three.row_m));
      EXPECT_EQ(values(one.w8), values(three.w8));
      EXPECT_EQ(values(one.w8_scale), values(three.w8_scale));
    }
  }
}

// What a Kestrel image stores (interleave_w4_int8_layout) reads back as the row-major matrix
// it came from, every code and parameter bit for bit, for each kind of group parameters.
TEST(W4Int8Layout, DeinterleavingGivesBackTheMatrixBitForBit) {
  kestrel::ThreadPool pool(3);
  for (auto [rows, cols, G] : kShapes) {
    for (Params p : kAll) {
      const RandomW4 w(rows, cols, G, p, 7 * rows + cols + static_cast<uint64_t>(p));
      const k::W4Int8Interleaved il = k::interleave_w4_int8_layout(w.view(), &pool);
      EXPECT_TRUE(il.w8.empty()) << "the layout alone, never the W8A8 copy";
      const bool zero_points = p == Params::kAffine16;  // 8-bit: mins8 tells
      for (kestrel::ThreadPool* on : {static_cast<kestrel::ThreadPool*>(nullptr), &pool}) {
        const kestrel::quant::W4Matrix back = k::deinterleave_w4_int8(il, zero_points, on);
        ASSERT_EQ(back.rows, rows);
        ASSERT_EQ(back.cols, cols);
        ASSERT_EQ(back.group_size, G);
        EXPECT_EQ(back.qs, w.codes);
        EXPECT_EQ(back.scales, w.scales);
        EXPECT_EQ(back.mins, w.mins) << "symmetric groups drop the layout's m = -8 d";
        EXPECT_EQ(back.scales8, w.scales8);
        EXPECT_EQ(back.mins8, w.mins8);
        EXPECT_EQ(back.row_scales, w.row_scales);
      }
      // ... and the round trip interleaves to the same layout.
      const k::W4Int8Interleaved again = k::interleave_w4_int8_layout(k::deinterleave_w4_int8(il, zero_points).view());
      EXPECT_EQ(values(again.codes), values(il.codes));
      EXPECT_EQ(values(again.mins), values(il.mins));
      EXPECT_EQ(values(again.row_d), values(il.row_d));
    }
  }
}

// A view of memory the struct does not own (an image's mapped tensors) computes what the owning
// copy computes, on every path; its own bytes are 0.
TEST(W4Int8Layout, AViewOfOutsideMemoryGivesTheCopysBits) {
  for (Params p : kAll) {
    const size_t rows = 48, cols = 256, G = 64;
    const RandomW4 w(rows, cols, G, p, 40 + static_cast<uint64_t>(p));
    const k::W4Int8Interleaved copy = k::interleave_w4_int8_layout(w.view());
    EXPECT_GT(copy.owned_bytes(), 0u);
    // The arrays somewhere else, as an image would hold them.
    const std::vector<uint8_t> codes = values(copy.codes), scales8 = values(copy.scales8), mins8 = values(copy.mins8);
    const std::vector<uint16_t> scales = values(copy.scales), mins = values(copy.mins);
    const std::vector<float> row_d = values(copy.row_d), row_m = values(copy.row_m);
    k::W4Int8Interleaved view;
    view.rows = rows;
    view.cols = cols;
    view.group_size = G;
    view.codes = codes;
    view.scales = scales;
    view.mins = mins;
    view.scales8 = scales8;
    view.mins8 = mins8;
    view.row_d = row_d;
    view.row_m = row_m;
    EXPECT_NO_THROW(k::check_w4_int8_layout(view));
    EXPECT_EQ(view.owned_bytes(), 0u);
    const size_t n = 9;
    const auto x = activations(n, cols, 77);
    for (k::Int8Isa isa : k::int8_isas_available()) {
      std::vector<float> a(n * rows), b(n * rows, -1.0f);
      k::gemv_w4_int8_on(isa, copy, x.data(), n, cols, a.data(), rows, 0, rows);
      k::gemv_w4_int8_on(isa, view, x.data(), n, cols, b.data(), rows, 0, rows);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << k::int8_isa_name(isa);
    }
    // add_default_w8a8 gives a view the W8A8 copy where interleave_w4_int8 would make one.
    k::W4Int8Interleaved with = view;
    k::add_default_w8a8(with, p == Params::kAffine16);
    const k::W4Int8Interleaved full = k::interleave_w4_int8(w.view());
    EXPECT_EQ(values(with.w8), values(full.w8));
    EXPECT_EQ(values(with.w8_scale), values(full.w8_scale));
    EXPECT_EQ(with.codes.data(), codes.data()) << "still a view";
  }
}

TEST(W4Int8Layout, ArraysOfTheWrongSizeAreRefused) {
  const RandomW4 w(32, 128, 32, Params::kAffine16, 9);
  const k::W4Int8Interleaved il = k::interleave_w4_int8_layout(w.view());
  EXPECT_NO_THROW(k::check_w4_int8_layout(il));
  k::W4Int8Interleaved short_codes = il;
  short_codes.codes = il.codes.first(il.codes.size() - 64);
  EXPECT_THROW(k::check_w4_int8_layout(short_codes), kestrel::Error);
  EXPECT_THROW(k::deinterleave_w4_int8(short_codes, true), kestrel::Error);
  k::W4Int8Interleaved no_mins = il;
  no_mins.mins = {};
  EXPECT_THROW(k::check_w4_int8_layout(no_mins), kestrel::Error);
  k::W4Int8Interleaved odd_rows = il;
  odd_rows.rows = 24;
  EXPECT_THROW(k::check_w4_int8_layout(odd_rows), kestrel::Error);
}

TEST(W4Int8, RefusesShapesItDoesNotRun) {
  const RandomW4 odd_rows(24, 64, 32, Params::kAffine16, 1);
  k::Matrix m = odd_rows.view();
  m.rows = 24;
  EXPECT_FALSE(k::w4_int8_supported(m));
  EXPECT_THROW(k::interleave_w4_int8(m), kestrel::Error);
  const RandomW4 small_groups(16, 64, 16, Params::kSymmetric16, 2);
  EXPECT_FALSE(k::w4_int8_supported(small_groups.view()));
  EXPECT_THROW(k::interleave_w4_int8(small_groups.view()), kestrel::Error);
  k::Matrix f32;
  f32.rows = 16;
  f32.cols = 32;
  EXPECT_FALSE(k::w4_int8_supported(f32));

  const RandomW4 ok(16, 64, 32, Params::kSymmetric16, 3);
  ASSERT_TRUE(k::w4_int8_supported(ok.view()));
  const auto il = k::interleave_w4_int8(ok.view());
  std::vector<float> x(64, 1.0f), y(16);
  EXPECT_THROW(k::gemv_w4_int8(il, x.data(), 1, 64, y.data(), 16, 0, 17), kestrel::Error);
}

}  // namespace

TEST(W4Int8, DecodeActivationsParseAndChoose) {
  EXPECT_EQ(k::parse_decode_activations("auto"), k::DecodeActivations::kAuto);
  EXPECT_EQ(k::parse_decode_activations("bf16"), k::DecodeActivations::kBf16);
  EXPECT_EQ(k::parse_decode_activations("int8"), k::DecodeActivations::kInt8);
  EXPECT_THROW(k::parse_decode_activations("fp8"), kestrel::Error);
  EXPECT_THROW(k::parse_decode_activations(""), kestrel::Error);
  EXPECT_TRUE(k::w4_int8_chosen(k::DecodeActivations::kInt8));
  EXPECT_FALSE(k::w4_int8_chosen(k::DecodeActivations::kBf16));
  EXPECT_EQ(k::w4_int8_chosen(k::DecodeActivations::kAuto), k::w4_int8_default());
  // No int8/bf16 switch (as in CI): int8 exactly where the CPU has a SIMD int8 path (AVX2 or
  // AVX512-VNNI).
  if (k::kernel_options().activations == k::DecodeActivations::kAuto) {
    EXPECT_EQ(k::w4_int8_default(), k::int8_simd_available());
  }
}
