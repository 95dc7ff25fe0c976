// The INT4 decode GEMV of 1-7 tokens, rows interleaved in blocks of 16 (gemv_w4_interleaved,
// the kernel images and w4a16 loads use) against the row-major gemv_w4_bf16, at Gemma 3 270M's
// and Gemma 4 E4B's shapes, one thread, the matrix in cache; each interleaved result is checked
// against the row-major one (float32 rounding of sum |w_i x_i|) before timing.
//   build/bench/kestrel_w4_interleaved_bench
// Results: docs/benchmarks.md, "Decode kernels for several tokens"; the int8-activation rows
// (W4/Int8, the default decode kernel where the CPU has AVX512-VNNI): docs/quantization.md.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemm_bf16.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/gemv_w4_bf16.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/gemv_w4_interleaved.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/quant/w4.h"

namespace {

namespace k = kestrel::kernels;
constexpr size_t kGroup = 32;
constexpr size_t kMaxTokens = 64;

// rows x cols: state.range(0) x state.range(1); group parameters of state.range(2) bits (16, or 8
// as the E4B-shaped images' --scale-bits 8).
struct Fixture {
  size_t rows, cols;
  kestrel::quant::W4Matrix q4;
  k::W4Interleaved interleaved;
  k::W4Int8Interleaved int8;
  std::vector<float> x;
  std::vector<k::W4GemvInput> inputs;
  Fixture(size_t n_rows, size_t n_cols, int bits) : rows(n_rows), cols(n_cols) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    std::vector<float> w(rows * cols);
    for (auto& v : w) v = normal(rng);
    kestrel::ThreadPool pool(1);
    q4 = kestrel::quant::quantize_w4(w.data(), rows, cols, kGroup, nullptr, true, pool);
    if (bits == 8) kestrel::quant::compress_group_params(q4, w.data(), nullptr, pool);
    if (k::w4_interleavable(q4.view())) interleaved = k::interleave_w4(q4.view());  // AVX512-BF16 only
    int8 = k::interleave_w4_int8(q4.view());
    x.resize(kMaxTokens * cols);
    for (auto& v : x) v = normal(rng);
    inputs.resize(kMaxTokens);
    for (size_t t = 0; t < kMaxTokens; ++t) k::prepare_w4_gemv(&x[t * cols], cols, kGroup, inputs[t]);
  }
};

Fixture& fixture(const benchmark::State& state) {
  static std::map<std::tuple<size_t, size_t, int>, std::unique_ptr<Fixture>> fixtures;
  const auto key = std::make_tuple(static_cast<size_t>(state.range(0)), static_cast<size_t>(state.range(1)),
                                   static_cast<int>(state.range(2)));
  auto& f = fixtures[key];
  if (f == nullptr) f = std::make_unique<Fixture>(std::get<0>(key), std::get<1>(key), std::get<2>(key));
  return *f;
}

void count(benchmark::State& state, const Fixture& f, size_t n) {
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(f.rows * f.cols * n),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

template <size_t NT>
void Interleaved16(benchmark::State& state) {
  if (!k::bf16_dot_available()) return state.SkipWithError("this CPU has no AVX512-BF16");
  Fixture& f = fixture(state);
  std::vector<float> y(NT * f.rows), ref(NT * f.rows);
  k::gemv_w4_interleaved(f.interleaved, f.x.data(), NT, f.cols, y.data(), f.rows, 0, f.rows);
  k::gemv_w4_bf16_tokens(f.q4.view(), f.inputs.data(), NT, ref.data(), f.rows, 0, f.rows);
  std::vector<float> row(f.cols);
  for (size_t i = 0; i < y.size(); ++i) {
    if (std::fabs(y[i] - ref[i]) <= 1e-4f * (1.0f + std::fabs(ref[i]))) continue;
    const size_t t = i / f.rows, r = i % f.rows;
    k::matrix_row(f.q4.view(), r, row.data());
    double magnitude = 0;
    for (size_t c = 0; c < f.cols; ++c) magnitude += std::fabs(row[c] * f.x[t * f.cols + c]);
    if (std::fabs(y[i] - ref[i]) > 2e-5 * magnitude) {
      return state.SkipWithError(("interleaved result differs at " + std::to_string(i)).c_str());
    }
  }
  for (auto _ : state) {
    k::gemv_w4_interleaved(f.interleaved, f.x.data(), NT, f.cols, y.data(), f.rows, 0, f.rows);
    benchmark::DoNotOptimize(y.data());
  }
  count(state, f, NT);
}

// The int8-activation kernel (gemv_w4_int8.h), checked first against float64 W x within the
// activations' rounding bound sum_b (max|x_b| / 254) sum_{i in b} |w_i| (+ 1e-5 sum |w_i x_i|
// for float32 rounding; blocks of 128 columns where the kernel takes superblocks).
template <size_t NT>
void Int8(benchmark::State& state) {
  Fixture& f = fixture(state);
  state.SetLabel(k::int8_isa_name(k::best_int8_isa()));
  std::vector<float> y(NT * f.rows);
  k::gemv_w4_int8(f.int8, f.x.data(), NT, f.cols, y.data(), f.rows, 0, f.rows);
  std::vector<float> row(f.cols);
  for (size_t r = 0; r < f.rows; ++r) {
    k::matrix_row(f.q4.view(), r, row.data());
    for (size_t t = 0; t < NT; ++t) {
      const float* x = &f.x[t * f.cols];
      double bound = 0, magnitude = 0, exact = 0;
      // The activations' blocks: 32 columns, or the superblocks of 128 that 8-bit parameters take.
      const size_t block = k::w4_int8_superblocks(f.int8) ? 128 : 32;
      for (size_t b = 0; b < f.cols / block; ++b) {
        double amax = 0, wabs = 0;
        for (size_t c = block * b; c < block * b + block; ++c) {
          amax = std::max(amax, static_cast<double>(std::fabs(x[c])));
          wabs += std::fabs(row[c]);
          magnitude += std::fabs(row[c] * x[c]);
          exact += static_cast<double>(row[c]) * x[c];
        }
        bound += amax / 254 * wabs;
      }
      if (std::fabs(y[t * f.rows + r] - exact) > 1.0001 * bound + 1e-5 * magnitude) {
        return state.SkipWithError(("int8 result out of bounds at row " + std::to_string(r)).c_str());
      }
    }
  }
  for (auto _ : state) {
    k::gemv_w4_int8(f.int8, f.x.data(), NT, f.cols, y.data(), f.rows, 0, f.rows);
    benchmark::DoNotOptimize(y.data());
  }
  count(state, f, NT);
}

template <size_t NT>
void RowMajor(benchmark::State& state) {
  if (!k::bf16_dot_available()) return state.SkipWithError("this CPU has no AVX512-BF16");
  Fixture& f = fixture(state);
  std::vector<float> y(NT * f.rows);
  for (auto _ : state) {
    k::gemv_w4_bf16_tokens(f.q4.view(), f.inputs.data(), NT, y.data(), f.rows, 0, f.rows);
    benchmark::DoNotOptimize(y.data());
  }
  count(state, f, NT);
}

// What a load without the int8 copy runs on this CPU: matmul() of the row-major matrix, one
// thread (the bf16 kernels with AVX512-BF16, else Highway's float32 path).
template <size_t NT>
void Matmul(benchmark::State& state) {
  Fixture& f = fixture(state);
  kestrel::ThreadPool pool(1);
  std::vector<float> y(NT * f.rows);
  for (auto _ : state) {
    k::matmul(f.q4.view(), f.x.data(), NT, f.cols, y.data(), f.rows, pool);
    benchmark::DoNotOptimize(y.data());
  }
  count(state, f, NT);
}

// Gemma 3 270M's ffn_gate (2048 x 640), and Gemma 4 E4B's ffn_gate (10240 x 2560) and ffn_down
// (2560 x 10240), the E4B shapes also with 8-bit group parameters.
#define KESTREL_SHAPES \
  ->Args({2048, 640, 16})->Args({10240, 2560, 16})->Args({2560, 10240, 16})->Args({10240, 2560, 8})->Args({2560, 10240, 8})
BENCHMARK(RowMajor<1>)->Name("W4/RowMajor/1") KESTREL_SHAPES;
BENCHMARK(Interleaved16<1>)->Name("W4/Interleaved16/1") KESTREL_SHAPES;
BENCHMARK(RowMajor<2>)->Name("W4/RowMajor/2") KESTREL_SHAPES;
BENCHMARK(Interleaved16<2>)->Name("W4/Interleaved16/2") KESTREL_SHAPES;
BENCHMARK(RowMajor<4>)->Name("W4/RowMajor/4") KESTREL_SHAPES;
BENCHMARK(Interleaved16<4>)->Name("W4/Interleaved16/4") KESTREL_SHAPES;
BENCHMARK(RowMajor<7>)->Name("W4/RowMajor/7") KESTREL_SHAPES;
BENCHMARK(Interleaved16<7>)->Name("W4/Interleaved16/7") KESTREL_SHAPES;
// Gemma 3 270M's ffn_down (640 x 2048) as well, against the int8-activation kernel on every
// shape.
BENCHMARK(Interleaved16<1>)->Name("W4/Interleaved16/1")->Args({640, 2048, 16});
BENCHMARK(Interleaved16<4>)->Name("W4/Interleaved16/4")->Args({640, 2048, 16});
BENCHMARK(Interleaved16<7>)->Name("W4/Interleaved16/7")->Args({640, 2048, 16});
BENCHMARK(Matmul<1>)->Name("W4/Matmul/1") KESTREL_SHAPES->Args({640, 2048, 16});
BENCHMARK(Matmul<4>)->Name("W4/Matmul/4") KESTREL_SHAPES->Args({640, 2048, 16});
BENCHMARK(Int8<1>)->Name("W4/Int8/1") KESTREL_SHAPES->Args({640, 2048, 16});
BENCHMARK(Int8<2>)->Name("W4/Int8/2") KESTREL_SHAPES->Args({640, 2048, 16});
BENCHMARK(Int8<4>)->Name("W4/Int8/4") KESTREL_SHAPES->Args({640, 2048, 16});
BENCHMARK(Int8<7>)->Name("W4/Int8/7") KESTREL_SHAPES->Args({640, 2048, 16});
// A prefill chunk of 64 tokens (matmul: the prefill tiles; gemv_w4_int8: 8-token tiles on
// AVX512-VNNI, 4-token ones on AVX2), and E4B's ffn_gate and 270M's ffn_up with 8-bit group
// parameters (the superblock path).
BENCHMARK(Matmul<64>)->Name("W4/Matmul/64")->Args({2048, 640, 16})->Args({640, 2048, 16});
BENCHMARK(Int8<64>)->Name("W4/Int8/64")->Args({2048, 640, 16})->Args({640, 2048, 16})->Args({10240, 2560, 8})->Args({2048, 640, 8});

}  // namespace

BENCHMARK_MAIN();
