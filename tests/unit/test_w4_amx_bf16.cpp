// The AMX-BF16 prefill tiles (kernels/gemm_w4_amx_bf16.h) against a float64 sum written here
// from the random matrix's own codes and parameters: w = fma(q, d, m) in float32 rounded to
// bfloat16, x rounded to bfloat16, so every product is exact and only the tile's float32
// additions separate the two (at most cols * 2^-24 * sum |w x|); every kind of group
// parameters, whole and partial tiles of tokens and rows, and each token's result the same
// whatever the tokens beside it and the row range. Skipped where the CPU or OS has no AMX-BF16.
#include <gtest/gtest.h>
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemm_w4_amx_bf16.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/kernel_options.h"
#include "random_w4.h"

namespace k = kestrel::kernels;

namespace {

using kestrel::testing::activations;
using kestrel::testing::Params;
using kestrel::testing::RandomW4;

double bf16(float v) { return kestrel::gguf::bf16_to_fp32(kestrel::gguf::fp32_to_bf16(v)); }

const std::vector<std::tuple<size_t, size_t, size_t>> kShapes = {
    {16, 32, 32}, {32, 640, 32}, {48, 256, 64}, {32, 512, 128}, {80, 2560, 32}, {16, 160, 32}, {16, 384, 96}};
const Params kAll[] = {Params::kSymmetric16, Params::kAffine16, Params::kAffine8, Params::kSymmetric8};

}  // namespace

TEST(W4AmxBf16, EqualsTheBf16ProductsWithinFloat32Sums) {
  if (!k::amx_bf16_available()) GTEST_SKIP() << "skipped: no AMX-BF16";
  for (auto [rows, cols, G] : kShapes) {
    for (Params p : kAll) {
      const RandomW4 w(rows, cols, G, p, rows * 5 + cols + static_cast<uint64_t>(p));
      const k::W4Int8Interleaved il = k::interleave_w4_int8(w.view());
      for (size_t n : {1, 15, 16, 17, 33, 40}) {
        const auto x = activations(n, cols, n + rows);
        std::vector<float> y(n * rows);
        k::gemm_w4_amx_bf16(il, x.data(), n, cols, y.data(), rows, 0, rows);
        for (size_t r = 0; r < rows; ++r) {
          std::vector<double> wr(cols);
          for (size_t c = 0; c < cols; ++c) {
            float d, m;
            w.params(r, c / G, d, m);
            wr[c] = bf16(std::fma(static_cast<float>(w.code(r, c)), d, m));
          }
          for (size_t t = 0; t < n; ++t) {
            double ref = 0, magnitude = 0;
            for (size_t c = 0; c < cols; ++c) {
              const double prod = wr[c] * bf16(x[t * cols + c]);
              ref += prod;
              magnitude += std::fabs(prod);
            }
            const double bound = static_cast<double>(cols) * 0x1p-24 * magnitude + 1e-30;
            ASSERT_LE(std::fabs(y[t * rows + r] - ref), bound)
                << "rows " << rows << " cols " << cols << " G " << G << " params " << static_cast<int>(p)
                << " tokens " << n << " token " << t << " row " << r;
          }
        }
      }
    }
  }
}

TEST(W4AmxBf16, EachTokenIsTheSameWhateverTheTokensAndRowRange) {
  if (!k::amx_bf16_available()) GTEST_SKIP() << "skipped: no AMX-BF16";
  const size_t rows = 64, cols = 640, n_max = 40;
  for (Params p : kAll) {
    const RandomW4 w(rows, cols, 32, p, 7 + static_cast<uint64_t>(p));
    const k::W4Int8Interleaved il = k::interleave_w4_int8(w.view());
    const auto x = activations(n_max, cols, 3);
    std::vector<float> all(n_max * rows);
    k::gemm_w4_amx_bf16(il, x.data(), n_max, cols, all.data(), rows, 0, rows);
    for (size_t n : {1, 7, 16, 23}) {
      for (size_t first : {0, 3, 17}) {
        for (auto [lo, hi] : std::vector<std::pair<size_t, size_t>>{{0, rows}, {5, 61}, {16, 32}, {17, 18}, {40, 64}}) {
          // Rows of x and y further apart than cols and rows (as matmul's callers pass them).
          const size_t x_stride = cols + 32, y_stride = rows + 16;
          std::vector<float> xs(n * x_stride, 1e30f), y(n * y_stride, -1.0f);
          for (size_t t = 0; t < n; ++t) std::memcpy(&xs[t * x_stride], &x[(first + t) * cols], cols * sizeof(float));
          k::gemm_w4_amx_bf16(il, xs.data(), n, x_stride, y.data(), y_stride, lo, hi);
          for (size_t t = 0; t < n; ++t) {
            for (size_t r = 0; r < y_stride; ++r) {
              if (r < lo || r >= hi) {
                ASSERT_EQ(y[t * y_stride + r], -1.0f) << "wrote outside the row range";
                continue;
              }
              ASSERT_EQ(std::memcmp(&y[t * y_stride + r], &all[(first + t) * rows + r], sizeof(float)), 0)
                  << "params " << static_cast<int>(p) << " tokens " << n << " first " << first << " rows [" << lo
                  << ", " << hi << ") token " << t << " row " << r;
            }
          }
        }
      }
    }
  }
}

TEST(W4AmxBf16, RefusesRowsPastTheMatrixAndMissingHardware) {
  const RandomW4 w(16, 64, 32, Params::kAffine16, 1);
  const k::W4Int8Interleaved il = k::interleave_w4_int8(w.view());
  std::vector<float> x(64, 1.0f), y(16);
  EXPECT_THROW(k::gemm_w4_amx_bf16(il, x.data(), 1, 64, y.data(), 16, 0, 17), kestrel::Error);
  if (!k::amx_bf16_available()) {
    EXPECT_THROW(k::gemm_w4_amx_bf16(il, x.data(), 1, 64, y.data(), 16, 0, 16), kestrel::Error);
  }
}

// Where /proc/cpuinfo (read here, independently of the CPUID and XCR0 checks the kernel makes)
// reports AMX-TILE, AMX-BF16 and AVX512-BF16, Linux grants the tile state and the tiles are taken,
// so the tests above ran; elsewhere they say "skipped: no AMX-BF16".
TEST(W4AmxBf16, IsAvailableWhereTheCpuHasIt) {
#if !(defined(__x86_64__) && defined(__linux__))
  // Not x86-64 Linux: no AMX (under qemu-user, /proc/cpuinfo is the x86 host's).
  EXPECT_FALSE(k::amx_bf16_available());
  GTEST_SKIP() << "skipped: no AMX-BF16 (not x86-64 Linux)";
#endif
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) GTEST_SKIP() << "skipped: no /proc/cpuinfo";
  std::string flags;
  char line[8192];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, "flags", 5) == 0) {
      flags = std::string(line) + " ";
      break;
    }
  }
  std::fclose(f);
  auto has = [&](const char* flag) { return flags.find(std::string(" ") + flag + " ") != std::string::npos; };
  const bool cpu = has("amx_tile") && has("amx_bf16") && has("avx512_bf16");
  if (!cpu) {
    EXPECT_FALSE(k::amx_bf16_available());
    EXPECT_FALSE(k::amx_prefill_enabled());
    GTEST_SKIP() << "skipped: no AMX-BF16";
  }
#if defined(__x86_64__) && defined(__linux__)
  // Linux may refuse the tile state (before 5.16, or a seccomp policy): asked here directly.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    EXPECT_FALSE(k::amx_bf16_available());
    GTEST_SKIP() << "skipped: Linux refuses the AMX tile state";
  }
#endif
  EXPECT_TRUE(k::amx_bf16_available()) << "the CPU has AMX-BF16 but the kernel does not take it";
  EXPECT_EQ(k::amx_prefill_enabled(), k::kernel_options().amx);
}
