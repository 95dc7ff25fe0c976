// FlashHead stage 1's kernel (kernels/gemv_q8_interleaved.h): every path (VNNI, AVX2, portable)
// agrees bit for bit on every shape, token count and row range; both equal a float64 sum of
// the formula the header states, with activations quantized here independently.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "random_q8.h"

namespace k = kestrel::kernels;

namespace {

using kestrel::testing::random_q8_0;
using kestrel::testing::edge_activations;
using kestrel::testing::q8_0_view;

TEST(Q8Interleaved, InterleavingOverAThreadPoolGivesTheSameCopy) {
  kestrel::ThreadPool pool(3);
  for (auto [rows, cols] : std::vector<std::pair<size_t, size_t>>{{16, 32}, {37, 64}, {64, 640}, {1000, 96}}) {
    const auto bytes = random_q8_0(rows, cols, 5 * rows + cols);
    const k::Q8Interleaved one = k::interleave_q8_0(q8_0_view(bytes, rows, cols));
    const k::Q8Interleaved three = k::interleave_q8_0(q8_0_view(bytes, rows, cols), &pool);
    EXPECT_TRUE(std::ranges::equal(one.codes, three.codes));
    EXPECT_TRUE(std::ranges::equal(one.scales, three.scales));
  }
}

TEST(Q8Interleaved, DeinterleavingGivesBackTheQ8_0RowsBitForBit) {
  // What a load does with an image's stored layout (image/q8_tensors.h) where a run takes float
  // activations; padded rows (37) included. A view of the copy's arrays (no `owned`), as the
  // image's mapped tensors are viewed, reads the same.
  kestrel::ThreadPool pool(3);
  for (auto [rows, cols] : std::vector<std::pair<size_t, size_t>>{{16, 32}, {37, 64}, {64, 640}}) {
    const auto bytes = random_q8_0(rows, cols, 7 * rows + cols);
    const k::Q8Interleaved il = k::interleave_q8_0(q8_0_view(bytes, rows, cols));
    k::Q8Interleaved view = il;
    view.owned.reset();
    EXPECT_EQ(il.owned_bytes(), il.codes.size() + il.scales.size() * sizeof(float));
    EXPECT_EQ(view.owned_bytes(), 0u);
    const auto back = k::deinterleave_q8_0(view, &pool);
    ASSERT_EQ(back.size(), bytes.size());
    EXPECT_EQ(std::memcmp(back.data(), bytes.data(), bytes.size()), 0) << rows << " x " << cols;
    EXPECT_TRUE(k::deinterleave_q8_0(view) == back);
    view.scales = view.scales.first(view.scales.size() - 1);
    EXPECT_THROW(k::check_q8_interleaved(view), kestrel::Error);
  }
}

TEST(Q8Interleaved, VnniAndPortablePathsAgreeAndEqualTheStatedFormula) {
  for (auto [rows, cols] : std::vector<std::pair<size_t, size_t>>{{16, 32}, {37, 64}, {64, 640}, {48, 2560}}) {
    const auto bytes = random_q8_0(rows, cols, rows + cols);
    const k::Matrix m = q8_0_view(bytes, rows, cols);
    const k::Q8Interleaved il = k::interleave_q8_0(m);
    // 1..19 tokens: every tile size of both paths (4 a pass on AVX2, 8 on AVX512-VNNI) and passes after a full one.
    const size_t n_max = 19;
    const auto x = edge_activations(n_max, cols, 3 * rows);
    k::Q8Activations xq;
    k::quantize_q8_activations(x.data(), n_max, cols, cols, xq);
    // The quantization, recomputed here: d = max|x| / 127, q = round-half-even(x / d).
    const size_t nb = cols / 32;
    for (size_t t = 0; t < n_max; ++t) {
      for (size_t b = 0; b < nb; ++b) {
        float amax = 0.0f;
        for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[t * cols + b * 32 + i]));
        const float d = amax / 127.0f;
        ASSERT_EQ(xq.scale[t * nb + b], d);
        int32_t sum = 0;
        for (size_t i = 0; i < 32; ++i) {
          const float v = x[t * cols + b * 32 + i];
          const int q = d > 0.0f ? static_cast<int>(std::nearbyint(v / d)) : 0;
          ASSERT_EQ(xq.q[t * cols + b * 32 + i], q);
          sum += q;
        }
        ASSERT_EQ(xq.sum128[t * nb + b], 128 * sum);
      }
    }
    // float64 reference of sum_b (sum_i w q) * s * d.
    std::vector<float> portable(n_max * rows);
    k::gemv_q8_interleaved_scalar(il, xq, portable.data(), rows, 0, rows);
    for (size_t t = 0; t < n_max; ++t) {
      for (size_t r = 0; r < rows; ++r) {
        double magnitude = 0;
        const double ref = kestrel::testing::q8_0_reference(m, xq, t, r, &magnitude);
        ASSERT_NEAR(portable[t * rows + r], ref, 1e-5 * magnitude + 1e-30) << rows << "x" << cols << " r=" << r;
      }
    }
    // Every token count and row range (ranges cutting blocks, as the pool's split does): the
    // dispatching entry and every path this CPU runs (int8_isa.h) write exactly the portable
    // path's bits.
    std::vector<std::optional<k::Int8Isa>> paths = {std::nullopt};
    for (k::Int8Isa isa : k::int8_isas_available()) paths.emplace_back(isa);
    for (size_t n = 1; n <= n_max; ++n) {
      k::Q8Activations some;
      k::quantize_q8_activations(x.data(), n, cols, cols, some);
      for (auto [begin, end] : std::vector<std::pair<size_t, size_t>>{{0, rows}, {3, rows - 5}, {rows / 2, rows}}) {
       for (const auto& path : paths) {
        SCOPED_TRACE(path ? k::int8_isa_name(*path) : "dispatch");
        std::vector<float> y(n * rows, -1.0f);
        if (path) {
          k::gemv_q8_interleaved_on(*path, il, some, y.data(), rows, begin, end);
        } else {
          k::gemv_q8_interleaved(il, some, y.data(), rows, begin, end);
        }
        for (size_t t = 0; t < n; ++t) {
          for (size_t r = 0; r < rows; ++r) {
            if (r < begin || r >= end) {
              ASSERT_EQ(y[t * rows + r], -1.0f) << "wrote outside its rows";
            } else {
              ASSERT_EQ(y[t * rows + r], portable[t * rows + r]) << "n=" << n << " rows " << begin << ".." << end << " r=" << r;
            }
          }
        }
       }
      }
    }
  }
  if (k::int8_isas_available().size() == 1) GTEST_SKIP() << "checked the portable path only: no AVX2 or AVX512-VNNI";
}

TEST(Q8Interleaved, PathsUnavailableHereAreErrors) {
  const auto bytes = random_q8_0(16, 64, 4);
  const k::Q8Interleaved il = k::interleave_q8_0(q8_0_view(bytes, 16, 64));
  k::Q8Activations xq;
  k::quantize_q8_activations(std::vector<float>(64, 1.0f).data(), 1, 64, 64, xq);
  std::vector<float> y(16);
  EXPECT_NO_THROW(k::gemv_q8_interleaved_on(k::Int8Isa::kPortable, il, xq, y.data(), 16, 0, 16));
  for (k::Int8Isa isa : {k::Int8Isa::kAvx2, k::Int8Isa::kAvx512Vnni}) {
    if (k::int8_isa_available(isa)) continue;
    EXPECT_THROW(k::gemv_q8_interleaved_on(isa, il, xq, y.data(), 16, 0, 16), kestrel::Error) << k::int8_isa_name(isa);
  }
}

TEST(Q8Interleaved, BadShapesAreErrors) {
  const auto bytes = random_q8_0(16, 64, 1);
  const k::Q8Interleaved il = k::interleave_q8_0(q8_0_view(bytes, 16, 64));
  k::Q8Activations xq;
  const std::vector<float> x(32, 1.0f);
  k::quantize_q8_activations(x.data(), 1, 32, 32, xq);
  std::vector<float> y(16);
  EXPECT_THROW(k::gemv_q8_interleaved(il, xq, y.data(), 16, 0, 16), kestrel::Error);  // 32 vs 64 columns
  k::quantize_q8_activations(std::vector<float>(64, 1.0f).data(), 1, 64, 64, xq);
  EXPECT_THROW(k::gemv_q8_interleaved(il, xq, y.data(), 16, 0, 17), kestrel::Error);  // past the rows
  EXPECT_THROW(k::quantize_q8_activations(x.data(), 1, 31, 31, xq), kestrel::Error);
  k::Matrix f32;
  f32.type = k::WeightType::kF32;
  f32.rows = 16;
  f32.cols = 64;
  EXPECT_THROW(k::interleave_q8_0(f32), kestrel::Error);
}

}  // namespace
