// Experiment (bench only, not used by the runtime): the INT4 GEMV of a few tokens with the rows
// interleaved in blocks of 16, against today's row-major kernel (gemv_w4_bf16).
//
// Today's kernel computes one row at a time: per row it prepares the group scales and offsets,
// runs its chunks, and ends with two horizontal sums per token. At Gemma 3 270M's 640 columns a
// row is only five 128-weight chunks, so that per-row work weighs as much as the dot products.
// Here 16 rows share every instruction: after unpacking, float32 lane i of a `vdpbf16ps` is row
// i, its two bf16 words a pair of columns, and the activations' pair is broadcast to all lanes.
// A row block ends with 16 sums in one vector (no horizontal sums), and the scales and offsets
// of a group are one vector for the 16 rows. Which layout decode and batched decode should use
// is what this measures; results are checked against the row-major kernel (float32 rounding
// differs, so within a tolerance, not bit for bit).
//   KESTREL_BENCH_THREADS is not read: one thread, the kernels called directly.
//   build/bench/kestrel_w4_interleaved_bench
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemm_bf16.h"
#include "kestrel/kernels/gemv_w4_bf16.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/quant/w4.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 warns inside its own avx512fintrin.h about operands it deliberately leaves undefined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

namespace {

namespace k = kestrel::kernels;
constexpr size_t kGroup = 32, kBlock = 16;
constexpr size_t kMaxTokens = 8;

// The 16-row interleaved copy of a kW4 matrix: per block, per octet of columns, 64 bytes; per
// block and group, 16 fp16 scales and 16 fp16 minimums.
struct Interleaved {
  std::vector<uint8_t> codes;
  std::vector<uint16_t> d, m;
};

uint8_t code_of(const k::Matrix& w, size_t r, size_t c) {
  const size_t g = c / w.group_size, within = c % w.group_size, half = w.group_size / 2;
  const uint8_t byte = w.row(r)[g * half + within % half];
  return within >= half ? byte >> 4 : byte & 0x0F;
}

Interleaved interleave(const k::Matrix& w) {
  const size_t n_groups = w.cols / w.group_size, octets = w.cols / 8;
  Interleaved out;
  out.codes.assign(w.rows / kBlock * octets * 64, 0);
  out.d.resize(w.rows * n_groups);
  out.m.resize(w.rows * n_groups);
  std::vector<float> d(n_groups), m(n_groups);
  for (size_t r = 0; r < w.rows; ++r) {
    const size_t block = r / kBlock, i = r % kBlock;
    k::w4_group_params(w, r, d.data(), m.data());
    for (size_t g = 0; g < n_groups; ++g) {
      out.d[(block * n_groups + g) * kBlock + i] = kestrel::gguf::fp32_to_fp16(d[g]);
      out.m[(block * n_groups + g) * kBlock + i] = kestrel::gguf::fp32_to_fp16(m[g]);
    }
    for (size_t o = 0; o < octets; ++o) {
      uint8_t* bytes = &out.codes[(block * octets + o) * 64];
      for (size_t v = 0; v < 4; ++v) {
        for (size_t j = 0; j < 2; ++j) {
          // Vector v (unpack lo/hi of the low, then of the high nibbles) holds columns
          // 8o + 2v, 8o + 2v + 1 of row i in its float32 lane i.
          const size_t at = 16 * (i / 4) + (v & 1) * 8 + (2 * i + j) % 8;
          const uint8_t q = code_of(w, r, 8 * o + 2 * v + j);
          bytes[at] |= v >= 2 ? static_cast<uint8_t>(q << 4) : q;
        }
      }
    }
  }
  return out;
}

__attribute__((target("avx512f,avx512bw,avx512bf16,f16c"))) inline __m512bh bh(__m512i v) {
  return reinterpret_cast<__m512bh>(v);
}

// y[t][row0 .. row0 + 16) for NT tokens; x[t]: bf16 activations in column order, sums[t]: their
// per-group sums.
template <size_t NT>
__attribute__((target("avx512f,avx512bw,avx512bf16,f16c"))) void block16(
    const Interleaved& w, size_t block, size_t cols, const uint16_t* const* x, const float* const* sums,
    float* const* y, size_t row0) {
  const size_t n_groups = cols / kGroup, octets = cols / 8;
  const __m512i low = _mm512_set1_epi8(0x0F), bias = _mm512_set1_epi8(0x43);
  __m512 acc[NT], off_acc[NT];
  for (size_t t = 0; t < NT; ++t) acc[t] = off_acc[t] = _mm512_setzero_ps();
  const uint8_t* codes = &w.codes[block * octets * 64];
  for (size_t g = 0; g < n_groups; ++g) {
    __m512 dot_a[NT], dot_b[NT];
    for (size_t t = 0; t < NT; ++t) dot_a[t] = dot_b[t] = _mm512_setzero_ps();
    for (size_t oi = 0; oi < kGroup / 8; ++oi) {
      const size_t o = g * (kGroup / 8) + oi;
      const __m512i bytes = _mm512_loadu_si512(codes + 64 * o);
      const __m512i lo = _mm512_and_si512(bytes, low), hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low);
      const __m512bh w0 = bh(_mm512_unpacklo_epi8(lo, bias)), w1 = bh(_mm512_unpackhi_epi8(lo, bias)),
                     w2 = bh(_mm512_unpacklo_epi8(hi, bias)), w3 = bh(_mm512_unpackhi_epi8(hi, bias));
      for (size_t t = 0; t < NT; ++t) {
        int32_t pairs[4];
        std::memcpy(pairs, x[t] + 8 * o, sizeof(pairs));
        __m512& dot = oi % 2 == 0 ? dot_a[t] : dot_b[t];
        dot = _mm512_dpbf16_ps(dot, w0, bh(_mm512_set1_epi32(pairs[0])));
        dot = _mm512_dpbf16_ps(dot, w1, bh(_mm512_set1_epi32(pairs[1])));
        dot = _mm512_dpbf16_ps(dot, w2, bh(_mm512_set1_epi32(pairs[2])));
        dot = _mm512_dpbf16_ps(dot, w3, bh(_mm512_set1_epi32(pairs[3])));
      }
    }
    const size_t at = (block * n_groups + g) * kBlock;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&w.d[at])));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&w.m[at])));
    const __m512 offset = _mm512_fnmadd_ps(d, _mm512_set1_ps(128.0f), m);
    for (size_t t = 0; t < NT; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_add_ps(dot_a[t], dot_b[t]), d, acc[t]);
      off_acc[t] = _mm512_fmadd_ps(offset, _mm512_set1_ps(sums[t][g]), off_acc[t]);
    }
  }
  for (size_t t = 0; t < NT; ++t) _mm512_storeu_ps(y[t] + row0, _mm512_add_ps(acc[t], off_acc[t]));
}

template <size_t NT>
void interleaved_gemv(const Interleaved& w, size_t rows, size_t cols, const uint16_t* const* x,
                      const float* const* sums, float* const* y) {
  for (size_t b = 0; b < rows / kBlock; ++b) block16<NT>(w, b, cols, x, sums, y, b * kBlock);
}

// rows x cols: state.range(0) x state.range(1).
struct Fixture {
  size_t rows, cols;
  kestrel::quant::W4Matrix q4;
  Interleaved inter;
  std::vector<float> x;
  std::vector<std::vector<uint16_t>> x16;
  std::vector<std::vector<float>> sums;
  std::vector<k::W4GemvInput> inputs;
  Fixture(size_t n_rows, size_t n_cols) : rows(n_rows), cols(n_cols) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    std::vector<float> w(rows * cols);
    for (auto& v : w) v = normal(rng);
    kestrel::ThreadPool pool(1);
    q4 = kestrel::quant::quantize_w4(w.data(), rows, cols, kGroup, nullptr, true, pool);
    inter = interleave(q4.view());
    x.resize(kMaxTokens * cols);
    for (auto& v : x) v = normal(rng);
    x16.assign(kMaxTokens, std::vector<uint16_t>(cols));
    sums.assign(kMaxTokens, std::vector<float>(cols / kGroup, 0.0f));
    inputs.resize(kMaxTokens);
    for (size_t t = 0; t < kMaxTokens; ++t) {
      k::to_bf16(&x[t * cols], x16[t].data(), cols);
      for (size_t c = 0; c < cols; ++c) sums[t][c / kGroup] += kestrel::gguf::bf16_to_fp32(x16[t][c]);
      k::prepare_w4_gemv(&x[t * cols], cols, kGroup, inputs[t]);
    }
  }
};

Fixture& fixture(const benchmark::State& state) {
  static std::map<std::pair<size_t, size_t>, std::unique_ptr<Fixture>> fixtures;
  const auto shape = std::make_pair(static_cast<size_t>(state.range(0)), static_cast<size_t>(state.range(1)));
  auto& f = fixtures[shape];
  if (f == nullptr) f = std::make_unique<Fixture>(shape.first, shape.second);
  return *f;
}

template <size_t NT>
void Interleaved16(benchmark::State& state) {
  if (!k::bf16_dot_available()) return state.SkipWithError("this CPU has no AVX512-BF16");
  Fixture& f = fixture(state);
  const size_t rows = f.rows, cols = f.cols;
  std::vector<float> y(NT * rows), ref(NT * rows);
  const uint16_t* xs[NT];
  const float* ss[NT];
  float* ys[NT];
  for (size_t t = 0; t < NT; ++t) xs[t] = f.x16[t].data(), ss[t] = f.sums[t].data(), ys[t] = &y[t * rows];
  interleaved_gemv<NT>(f.inter, rows, cols, xs, ss, ys);
  k::gemv_w4_bf16_tokens(f.q4.view(), f.inputs.data(), NT, ref.data(), rows, 0, rows);
  // Both sum bf16 products in float32, in different orders: they agree to float32 rounding of
  // sum |w_i x_i| (as W4.Bf16GemvMatchesRoundedReference bounds the row-major kernel).
  std::vector<float> row(cols);
  for (size_t i = 0; i < y.size(); ++i) {
    if (std::fabs(y[i] - ref[i]) <= 1e-4f * (1.0f + std::fabs(ref[i]))) continue;
    const size_t t = i / rows, r = i % rows;
    k::matrix_row(f.q4.view(), r, row.data());
    double magnitude = 0;
    for (size_t c = 0; c < cols; ++c) magnitude += std::fabs(row[c] * kestrel::gguf::bf16_to_fp32(f.x16[t][c]));
    if (std::fabs(y[i] - ref[i]) > 2e-5 * magnitude) {
      return state.SkipWithError(("interleaved result differs at " + std::to_string(i)).c_str());
    }
  }
  for (auto _ : state) {
    interleaved_gemv<NT>(f.inter, rows, cols, xs, ss, ys);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(rows * cols * NT),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

template <size_t NT>
void RowMajor(benchmark::State& state) {
  if (!k::bf16_dot_available()) return state.SkipWithError("this CPU has no AVX512-BF16");
  Fixture& f = fixture(state);
  const size_t rows = f.rows, cols = f.cols;
  std::vector<float> y(NT * rows);
  for (auto _ : state) {
    k::gemv_w4_bf16_tokens(f.q4.view(), f.inputs.data(), NT, y.data(), rows, 0, rows);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(rows * cols * NT),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// Gemma 3 270M's ffn_gate (2048 x 640), and Gemma 4 E4B's ffn_gate (10240 x 2560) and ffn_down
// (2560 x 10240).
#define KESTREL_SHAPES ->Args({2048, 640})->Args({10240, 2560})->Args({2560, 10240})
BENCHMARK(RowMajor<1>)->Name("W4/RowMajor/1") KESTREL_SHAPES;
BENCHMARK(Interleaved16<1>)->Name("W4/Interleaved16/1") KESTREL_SHAPES;
BENCHMARK(RowMajor<2>)->Name("W4/RowMajor/2") KESTREL_SHAPES;
BENCHMARK(Interleaved16<2>)->Name("W4/Interleaved16/2") KESTREL_SHAPES;
BENCHMARK(RowMajor<4>)->Name("W4/RowMajor/4") KESTREL_SHAPES;
BENCHMARK(Interleaved16<4>)->Name("W4/Interleaved16/4") KESTREL_SHAPES;
BENCHMARK(RowMajor<7>)->Name("W4/RowMajor/7") KESTREL_SHAPES;
BENCHMARK(Interleaved16<7>)->Name("W4/Interleaved16/7") KESTREL_SHAPES;

}  // namespace
#endif

BENCHMARK_MAIN();
