// The kernel registry (kernels/registry.h) and the kernel switches (kernels/kernel_options.h):
// every layout finds a kernel in both phases; the layout a load chooses follows the matrix's role,
// the activations and the switches; matmul runs the kernel the table names (its output equals that
// kernel's own, bit for bit); the switches parse, print and refuse as documented.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/kernels/gemm_bf16.h"
#include "kestrel/kernels/gemm_w4_amx_bf16.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/gemv_q8_rows.h"
#include "kestrel/kernels/gemv_w4_bf16.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/gemv_w4_interleaved.h"
#include "kestrel/kernels/int8_isa.h"
#include "kestrel/kernels/kernel_options.h"
#include "kestrel/kernels/registry.h"
#include "random_q8.h"
#include "random_vector.h"
#include "random_w4.h"

namespace k = kestrel::kernels;

namespace {

using kestrel::testing::Params;
using kestrel::testing::RandomW4;

constexpr k::WeightLayout kLayouts[] = {
    k::WeightLayout::kF32Rows,       k::WeightLayout::kF16Rows,          k::WeightLayout::kBF16Rows,
    k::WeightLayout::kQ8_0Rows,      k::WeightLayout::kQ8_0Int8Rows,     k::WeightLayout::kQ8_0Interleaved,
    k::WeightLayout::kW4Rows,        k::WeightLayout::kW4Int8Rows,       k::WeightLayout::kW4Interleaved,
    k::WeightLayout::kW4Int8Interleaved,
};

// Restores the process's switches when a test that changes them ends.
class SwitchesGuard {
 public:
  SwitchesGuard() : saved_(k::kernel_options()) {}
  ~SwitchesGuard() { k::set_kernel_options(saved_); }
  SwitchesGuard(const SwitchesGuard&) = delete;
  SwitchesGuard& operator=(const SwitchesGuard&) = delete;

 private:
  k::KernelOptions saved_;
};

TEST(KernelRegistry, EveryLayoutHasAKernelThatNeedsNothingInEveryPhase) {
  for (const k::WeightLayout layout : kLayouts) {
    for (const k::Phase phase : {k::Phase::kDecode, k::Phase::kPrefill}) {
      bool found = false;
      for (const k::KernelRule& rule : k::kernel_rules()) {
        found = found || (rule.layout == layout && (rule.phase == phase || rule.phase == k::Phase::kAny) &&
                          rule.need == k::Need::kNothing);
      }
      EXPECT_TRUE(found) << "layout " << static_cast<int>(layout) << " phase " << static_cast<int>(phase);
    }
  }
  for (const k::KernelRule& rule : k::kernel_rules()) EXPECT_STRNE(k::kernel_name(rule.kernel), "?");
}

TEST(KernelRegistry, ChoosesByLayoutAndPhase) {
  const RandomW4 w4(64, 128, 32, Params::kAffine16, 1);
  const k::Matrix rows = w4.view();
  EXPECT_EQ(k::layout_of(rows), k::WeightLayout::kW4Rows);
  EXPECT_EQ(k::choose_kernel(rows, 1), k::gemv_w4_bf16_supported(rows) ? k::Kernel::kW4Bf16Rows : k::Kernel::kW4Rows);
  EXPECT_EQ(k::choose_kernel(rows, 7), k::choose_kernel(rows, 1));
  EXPECT_EQ(k::choose_kernel(rows, 8),
            k::bf16_dot_available() ? k::Kernel::kW4DequantBf16Tiles : k::Kernel::kW4DequantF32Tiles);
  EXPECT_FALSE(k::kernel_batch_invariant(rows));

  const k::W4Int8Interleaved copy = k::interleave_w4_int8(rows);
  k::Matrix int8 = rows;
  int8.interleaved_int8 = &copy;
  EXPECT_EQ(k::layout_of(int8), k::WeightLayout::kW4Int8Interleaved);
  EXPECT_EQ(k::choose_kernel(int8, 1), k::Kernel::kW4Int8);
  EXPECT_EQ(k::choose_kernel(int8, 64), k::amx_prefill_enabled() ? k::Kernel::kW4AmxBf16 : k::Kernel::kW4Int8);
  EXPECT_EQ(k::kernel_batch_invariant(int8), !k::amx_prefill_enabled());
  EXPECT_EQ(k::matmul_rows_invariant(int8), k::kernel_batch_invariant(int8));

  const auto q8 = kestrel::testing::random_q8_0(32, 64, 2);
  k::Matrix q8_rows = kestrel::testing::q8_0_view(q8, 32, 64);
  EXPECT_EQ(k::choose_kernel(q8_rows, 1), k::Kernel::kQ8_0Rows);
  EXPECT_TRUE(k::kernel_batch_invariant(q8_rows));
  q8_rows.int8_rows = true;
  EXPECT_EQ(k::layout_of(q8_rows), k::WeightLayout::kQ8_0Int8Rows);
  EXPECT_EQ(k::choose_kernel(q8_rows, 100), k::Kernel::kQ8_0Int8Rows);
}

TEST(KernelRegistry, LayoutFollowsRoleActivationsAndSwitches) {
  SwitchesGuard guard;
  const RandomW4 w4(64, 128, 32, Params::kSymmetric16, 3);
  const k::Matrix m = w4.view();
  using L = k::WeightLayout;
  using R = k::MatrixRole;
  EXPECT_EQ(k::choose_layout(m, R::kLayer, true, k::DecodeActivations::kInt8), L::kW4Int8Interleaved);
  EXPECT_EQ(k::choose_layout(m, R::kLayer, true, k::DecodeActivations::kBf16),
            k::w4_interleavable(m) ? L::kW4Interleaved : L::kW4Rows);
  // A head never gets the INT4 copy: its rows as stored, with int8 activations where they run.
  const bool simd = k::int8_simd_available();
  EXPECT_EQ(k::choose_layout(m, R::kHead, true, k::DecodeActivations::kInt8), simd ? L::kW4Int8Rows : L::kW4Rows);
  EXPECT_EQ(k::choose_layout(m, R::kHead, false, k::DecodeActivations::kInt8), L::kW4Rows);

  const auto bytes = kestrel::testing::random_q8_0(32, 64, 4);
  const k::Matrix q8 = kestrel::testing::q8_0_view(bytes, 32, 64);
  EXPECT_EQ(k::choose_layout(q8, R::kLayer, true, k::DecodeActivations::kInt8),
            simd ? L::kQ8_0Interleaved : L::kQ8_0Rows);
  EXPECT_EQ(k::choose_layout(q8, R::kLayer, false, k::DecodeActivations::kInt8), L::kQ8_0Rows);  // source form
  EXPECT_EQ(k::choose_layout(q8, R::kHead, true, k::DecodeActivations::kInt8), simd ? L::kQ8_0Interleaved : L::kQ8_0Rows);
  EXPECT_EQ(k::choose_layout(q8, R::kHeadInPlace, true, k::DecodeActivations::kInt8),
            simd ? L::kQ8_0Int8Rows : L::kQ8_0Rows);
  EXPECT_EQ(k::choose_layout(q8, R::kHeadInPlace, true, k::DecodeActivations::kBf16), L::kQ8_0Rows);

  // The switches: "bf16" makes auto loads take bf16 activations, "no-interleave" drops the bf16
  // decode copy.
  k::set_kernel_options(k::parse_kernel_options("bf16,no-interleave", "test"));
  EXPECT_EQ(k::choose_layout(m, R::kLayer, true, k::DecodeActivations::kAuto), L::kW4Rows);
  EXPECT_EQ(k::choose_layout(m, R::kLayer, true, k::DecodeActivations::kInt8), L::kW4Int8Interleaved);
  k::set_kernel_options(k::parse_kernel_options("int8", "test"));
  EXPECT_EQ(k::choose_layout(m, R::kLayer, true, k::DecodeActivations::kAuto), L::kW4Int8Interleaved);
}

// A layer matrix an image stores in the int8 layout alone (no row-major form): kept where int8
// activations are chosen, else the rows (the loader de-interleaves them); matmul runs it.
TEST(KernelRegistry, AnImagesInt8LayoutIsKeptWhereInt8ActivationsRun) {
  SwitchesGuard guard;
  kestrel::ThreadPool pool(2);
  const RandomW4 w4(64, 256, 64, Params::kAffine16, 11);
  const k::W4Int8Interleaved copy = k::interleave_w4_int8_layout(w4.view());
  k::Matrix stored;
  stored.type = k::WeightType::kW4;
  stored.rows = 64;
  stored.cols = 256;
  stored.group_size = 64;
  stored.interleaved_int8 = &copy;
  using L = k::WeightLayout;
  using R = k::MatrixRole;
  EXPECT_EQ(k::layout_of(stored), L::kW4Int8Interleaved);
  EXPECT_EQ(k::choose_layout(stored, R::kLayer, true, k::DecodeActivations::kInt8), L::kW4Int8Interleaved);
  EXPECT_EQ(k::choose_layout(stored, R::kLayer, true, k::DecodeActivations::kBf16), L::kW4Rows);
  k::set_kernel_options(k::parse_kernel_options("bf16", "test"));
  EXPECT_EQ(k::choose_layout(stored, R::kLayer, true, k::DecodeActivations::kAuto), L::kW4Rows);
  k::set_kernel_options(k::parse_kernel_options("int8", "test"));
  EXPECT_EQ(k::choose_layout(stored, R::kLayer, true, k::DecodeActivations::kAuto), L::kW4Int8Interleaved);
  EXPECT_EQ(stored.bytes(), 64 * 256 / 2 + 2 * (64 * 256 / 64) * 2) << "codes, fp16 d and m";
  EXPECT_THROW(k::row_slice(stored, 0, 16), kestrel::Error);
  std::vector<float> row(256);
  EXPECT_THROW(k::matrix_row(stored, 0, row.data()), kestrel::Error);
  k::Matrix with_rows = w4.view();
  with_rows.interleaved_int8 = &copy;
  for (const size_t n : {size_t{1}, size_t{16}}) {
    const std::vector<float> x = kestrel::testing::random_vector(n * 256, static_cast<uint32_t>(3 + n));
    std::vector<float> got(n * 64), want(n * 64);
    k::matmul(stored, x.data(), n, 256, got.data(), 64, pool);
    k::matmul(with_rows, x.data(), n, 256, want.data(), 64, pool);
    EXPECT_EQ(got, want) << n << " tokens";
  }
}

TEST(KernelRegistry, MatmulRunsTheKernelTheTableNames) {
  kestrel::ThreadPool pool(2);
  const RandomW4 w4(64, 256, 64, Params::kAffine16, 5);
  const k::W4Int8Interleaved copy = k::interleave_w4_int8(w4.view());
  k::Matrix int8 = w4.view();
  int8.interleaved_int8 = &copy;
  const auto bytes = kestrel::testing::random_q8_0(48, 256, 6);
  k::Matrix q8 = kestrel::testing::q8_0_view(bytes, 48, 256);
  q8.int8_rows = true;
  for (const size_t n : {size_t{1}, size_t{5}, size_t{16}}) {
    const std::vector<float> x = kestrel::testing::random_vector(n * 256, static_cast<uint32_t>(7 + n));
    std::vector<float> got(n * 64), want(n * 64);
    k::matmul(int8, x.data(), n, 256, got.data(), 64, pool);
    if (k::choose_kernel(int8, n) == k::Kernel::kW4Int8) {
      k::gemv_w4_int8(copy, x.data(), n, 256, want.data(), 64, 0, 64);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << n << " tokens";
    }
    std::vector<float> got8(n * 48), want8(n * 48);
    k::matmul(q8, x.data(), n, 256, got8.data(), 48, pool);
    ASSERT_EQ(k::choose_kernel(q8, n), k::Kernel::kQ8_0Int8Rows);
    k::Q8Activations qa;
    k::quantize_q8_activations(x.data(), n, 256, 256, qa);
    k::gemv_q8_rows(q8, qa, 0, n, want8.data(), 48, 0, 48);
    EXPECT_EQ(0, std::memcmp(got8.data(), want8.data(), got8.size() * sizeof(float))) << n << " tokens";
  }
}

TEST(KernelOptions, ParsesEveryNameAndPrintsTheCanonicalList) {
  const k::KernelOptions o =
      k::parse_kernel_options(" no-avx2 , no-vnni,no-bf16-dot,no-bf16-attention,no-interleave,amx,w8a8,bf16,", "test");
  EXPECT_FALSE(o.avx2);
  EXPECT_FALSE(o.avx512_vnni);
  EXPECT_FALSE(o.bf16_dot);
  EXPECT_FALSE(o.bf16_attention);
  EXPECT_FALSE(o.interleave);
  EXPECT_TRUE(o.amx);
  EXPECT_TRUE(o.w8a8);
  EXPECT_EQ(o.activations, k::DecodeActivations::kBf16);
  EXPECT_EQ(k::kernel_options_name(o), "bf16,no-avx2,no-vnni,no-bf16-dot,no-bf16-attention,no-interleave,amx,w8a8");
  EXPECT_EQ(k::parse_kernel_options(k::kernel_options_name(o), "test"), o);
  EXPECT_EQ(k::kernel_options_name(k::parse_kernel_options("", "test")), "default");
  EXPECT_EQ(k::parse_kernel_options("default", "test"), k::KernelOptions{});
  // A list applies on top of a base: the environment's switches, then --kernels.
  const k::KernelOptions on_top = k::parse_kernel_options("int8", "test", o);
  EXPECT_EQ(on_top.activations, k::DecodeActivations::kInt8);
  EXPECT_FALSE(on_top.avx2);
}

TEST(KernelOptions, RefusesAnUnknownNameListingTheKnownOnes) {
  try {
    k::parse_kernel_options("int8,avx512", "--kernels");
    FAIL() << "no error";
  } catch (const kestrel::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--kernels"), std::string::npos) << what;
    EXPECT_NE(what.find("'avx512'"), std::string::npos) << what;
    EXPECT_NE(what.find("no-interleave"), std::string::npos) << what;
  }
}

TEST(KernelOptions, TrimsLineEndsAndShortensALongNameInTheError) {
  EXPECT_EQ(k::parse_kernel_options("bf16\n", "test").activations, k::DecodeActivations::kBf16);
  try {
    k::parse_kernel_options(std::string(100000, 'x'), "test");
    FAIL() << "no error";
  } catch (const kestrel::Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 400u);
  }
}

TEST(KernelOptions, SwitchesTurnInstructionSetsOff) {
  SwitchesGuard guard;
  k::set_kernel_options(k::parse_kernel_options("no-avx2,no-vnni,no-bf16-dot", "test"));
  EXPECT_EQ(k::best_int8_isa(), k::Int8Isa::kPortable);
  EXPECT_FALSE(k::bf16_dot_available());
  EXPECT_EQ(k::kernel_label(k::Kernel::kW4Int8), "w4-int8.portable");
}

}  // namespace
