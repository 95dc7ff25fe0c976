// Micro-benchmarks of the matmul kernels at the default model's shapes (Google Benchmark).
//   build/bench/kestrel_kernels_bench --benchmark_filter=Decode
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemm_bf16.h"
#include "kestrel/kernels/gemm_w4_amx_bf16.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/int8_isa.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/model/attention.h"
#include "kestrel/model/kv_cache.h"
#include "kestrel/quant/w4.h"

namespace {

using kestrel::ThreadPool;
namespace k = kestrel::kernels;

std::vector<float> gaussian(size_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// KESTREL_BENCH_THREADS threads (default: every core). With 1, the CPU time of a kernel barely
// depends on what else the machine runs.
ThreadPool& pool() {
  static ThreadPool p([] {
    const char* t = std::getenv("KESTREL_BENCH_THREADS");
    return t != nullptr ? std::atoi(t) : 0;
  }());
  return p;
}

// rows x cols = state.range(0) x cols (640: Gemma 3 270M's d_model, so 2048 x 640 is its
// ffn_gate); tokens = state.range(1).
// int8_rows: a Q8_0 or INT4 matrix computed with int8 activations from its rows as stored
// (k::Matrix::int8_rows: a FlashHead image's head, an INT4 head).
void Run(benchmark::State& state, k::WeightType type, size_t cols = 640, bool int8_rows = false,
         bool interleaved = false) {
  const size_t rows = static_cast<size_t>(state.range(0));
  const size_t n = static_cast<size_t>(state.range(1));
  const auto w = gaussian(rows * cols);
  const auto x = gaussian(n * cols);
  std::vector<float> y(n * rows);
  kestrel::quant::W4Matrix q4;
  std::vector<uint16_t> b16;
  std::vector<uint8_t> q8;
  k::Q8Interleaved q8il;
  k::Matrix m{type, nullptr, rows, cols};
  switch (type) {
    case k::WeightType::kF32: m.data = w.data(); break;
    case k::WeightType::kW4:
      q4 = kestrel::quant::quantize_w4(w.data(), rows, cols, 32, nullptr, true, pool());
      m = q4.view();
      m.int8_rows = int8_rows;
      break;
    case k::WeightType::kF16:
    case k::WeightType::kBF16:
      b16.resize(w.size());
      for (size_t i = 0; i < w.size(); ++i) b16[i] = kestrel::gguf::fp32_to_bf16(w[i]);
      m.data = b16.data();
      break;
    case k::WeightType::kQ8_0:
      for (size_t b = 0; b < w.size() / 32; ++b) {
        const uint16_t d = kestrel::gguf::fp32_to_fp16(0.02f);
        q8.push_back(static_cast<uint8_t>(d & 0xff));
        q8.push_back(static_cast<uint8_t>(d >> 8));
        for (int i = 0; i < 32; ++i) q8.push_back(static_cast<uint8_t>(static_cast<int8_t>(w[b * 32 + i] * 40)));
      }
      m.data = q8.data();
      m.int8_rows = int8_rows;
      if (interleaved) q8il = k::interleave_q8_0(m, &pool()), m.interleaved_q8 = &q8il;
      break;
  }
  for (auto _ : state) {
    k::matmul(m, x.data(), n, cols, y.data(), rows, pool());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(rows * cols * n),
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight GB/s"] = benchmark::Counter(static_cast<double>(m.row_bytes() * rows),
                                                     benchmark::Counter::kIsIterationInvariantRate);
}

void F32(benchmark::State& s) { Run(s, k::WeightType::kF32); }
void W4(benchmark::State& s) { Run(s, k::WeightType::kW4); }
void BF16(benchmark::State& s) { Run(s, k::WeightType::kBF16); }
void Q8_0(benchmark::State& s) { Run(s, k::WeightType::kQ8_0); }
void Q8_0Int8Rows(benchmark::State& s) { Run(s, k::WeightType::kQ8_0, 640, true); }
void Q8_0Interleaved(benchmark::State& s) { Run(s, k::WeightType::kQ8_0, 640, false, true); }
void W4Cols(benchmark::State& s) { Run(s, k::WeightType::kW4, static_cast<size_t>(s.range(2))); }
void W4Int8Rows(benchmark::State& s) { Run(s, k::WeightType::kW4, static_cast<size_t>(s.range(2)), true); }

// Decode: one token over a large matrix (head-like 65536 rows) and a layer matrix.
BENCHMARK(F32)->Name("Decode/F32")->Args({2048, 1})->Args({65536, 1})->UseRealTime();
BENCHMARK(W4)->Name("Decode/W4")->Args({2048, 1})->Args({65536, 1})->UseRealTime();
// Gemma 4 E4B's MLP: ffn_gate / ffn_up (10240 x 2560) and ffn_down (2560 x 10240), which fit
// this machine's 32 MiB L3, and 40960 x 2560 (65 MiB of codes and scales), which streams from DRAM.
BENCHMARK(W4Cols)->Name("Decode/W4")->Args({10240, 1, 2560})->Args({2560, 1, 10240})->Args({40960, 1, 2560})->UseRealTime();
BENCHMARK(BF16)->Name("Decode/BF16")->Args({2048, 1})->Args({65536, 1})->UseRealTime();
BENCHMARK(Q8_0)->Name("Decode/Q8_0")->Args({2048, 1})->Args({65536, 1})->UseRealTime();
BENCHMARK(Q8_0Int8Rows)->Name("Decode/Q8_0Int8Rows")->Args({2048, 1})->Args({65536, 1})->UseRealTime();
// An INT4 head (--embedding int4) of Gemma 4's width, one token and a perplexity chunk's 8:
// float32 row-major kernel against int8 activations from the rows as stored.
BENCHMARK(W4Cols)->Name("Head/W4")->Args({65536, 1, 2560})->Args({65536, 8, 2560})->UseRealTime();
BENCHMARK(W4Int8Rows)->Name("Head/W4Int8Rows")->Args({65536, 1, 2560})->Args({65536, 8, 2560})->UseRealTime();
// A decode step of several sequences (continuous batching) or a verification of drafted tokens:
// the layer GEMV over 2-7 tokens, and FlashHead's stage 1 (16384 Q8_0 centroids) over 1-4 rows.
BENCHMARK(W4)->Name("Batch/W4")->Args({2048, 1})->Args({2048, 2})->Args({2048, 4})->Args({2048, 7})->UseRealTime();
BENCHMARK(Q8_0)->Name("Batch/Q8_0")->Args({16384, 1})->Args({16384, 2})->Args({16384, 4})->UseRealTime();
// The Q8_0 head's many-row products (FlashHead's stage 1 over the centroids, the dense head of
// scoring and perplexity in chunks of 64 tokens): the interleaved copy and the rows as stored.
BENCHMARK(Q8_0Interleaved)->Name("Batch/Q8_0Interleaved")->Args({16384, 1})->Args({16384, 4})->Args({16384, 8})->Args({16384, 16})->Args({65536, 64})->UseRealTime();
// Gemma 3's whole Q8_0 head (262,144 x 640, 178 MB): its int8 copy against its rows as stored
// (the copy's bits either way; issue 43: a dense head read in place saves the copy's memory).
BENCHMARK(Q8_0Interleaved)->Name("Head/Q8_0Interleaved")->Args({262144, 1})->Args({262144, 4})->Args({262144, 16})->UseRealTime();
BENCHMARK(Q8_0Int8Rows)->Name("Head/Q8_0Int8Rows")->Args({262144, 1})->Args({262144, 4})->Args({262144, 16})->UseRealTime();
BENCHMARK(Q8_0Int8Rows)->Name("Batch/Q8_0Int8Rows")->Args({16384, 4})->Args({16384, 8})->Args({16384, 16})->Args({65536, 64})->UseRealTime();
// Prefill: 256 tokens (one forward chunk).
BENCHMARK(F32)->Name("Prefill/F32")->Args({2048, 256})->UseRealTime();
BENCHMARK(W4)->Name("Prefill/W4")->Args({2048, 256})->UseRealTime();
BENCHMARK(BF16)->Name("Prefill/BF16")->Args({2048, 256})->UseRealTime();

// Decode attention of one token at position state.range(0) over a layer of the given shape
// (E4B's global layers: 8 query heads, 2 KV heads, head_dim 512), fp16 cache, rotating over 8
// layers' caches (E4B: 8 x 12.6 MB at 3,072 positions, more than the L3) as a decode step's
// layers do.
void DecodeAttention(benchmark::State& state, kestrel::model::AttentionShape shape,
                     kestrel::model::KvType type = kestrel::model::KvType::kF16) {
  const size_t pos = static_cast<size_t>(state.range(0));
  constexpr size_t kLayers = 8;
  std::vector<kestrel::model::LayerCache> caches(kLayers);
  const auto values = gaussian(4096);
  const size_t stride = shape.n_kv_heads * shape.head_dim;
  const kestrel::model::KvTypes types{type, type};
  std::vector<float> k_row(stride), v_row(stride);
  for (auto& c : caches) {
    c = kestrel::model::KvCache::allocate(pos + 1, {{pos + 1, stride, 0, shape.head_dim}}, types).layers[0];
    for (size_t p = 0; p <= pos; ++p) {
      for (size_t i = 0; i < stride; ++i) {
        k_row[i] = 0.05f * values[(p * stride + i) % values.size()];
        v_row[i] = values[((p * stride + i) * 7) % values.size()];
      }
      c.k.write(p, k_row.data());
      c.v.write(p, v_row.data());
    }
  }
  const auto q = gaussian(shape.n_heads * shape.head_dim);
  std::vector<float> out(q.size());
  size_t layer = 0;
  for (auto _ : state) {
    kestrel::model::cached_attention(shape, q.data(), 1, pos, caches[layer], out.data(), pool());
    layer = (layer + 1) % kLayers;
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["KV GB/s"] = benchmark::Counter(static_cast<double>(2 * (pos + 1) * caches[0].k.slot_bytes()),
                                                benchmark::Counter::kIsIterationInvariantRate);
  // QK^T and PV: 2 x heads x head_dim multiply-adds per visible position.
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(2 * (pos + 1) * shape.n_heads * shape.head_dim),
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK_CAPTURE(DecodeAttention, E4B_global, kestrel::model::AttentionShape{8, 2, 512, 0})
    ->Name("Decode/Attention/E4B-global")->Arg(3072)->UseRealTime();
// The default model's layers (Gemma 3 270M: 4 query heads on 1 KV head of 256), at the
// positions of a short chat, of a long prompt and of its whole 32k context (issue 44).
BENCHMARK_CAPTURE(DecodeAttention, Gemma3_270M, kestrel::model::AttentionShape{4, 1, 256, 0})
    ->Name("Decode/Attention/Gemma3-270M")->Arg(100)->Arg(3072)->Arg(32704)->UseRealTime();
// The same with the int8 cache (`-ctk q8 -ctv q8`: a byte per element and an fp16 scale per 32).
BENCHMARK_CAPTURE(DecodeAttention, Gemma3_270M_q8, kestrel::model::AttentionShape{4, 1, 256, 0},
                  kestrel::model::KvType::kQ8)
    ->Name("Decode/Attention/Gemma3-270M-q8")->Arg(3072)->Arg(32704)->UseRealTime();

// Prefill attention of state.range(0) tokens from position 0 over a global (causal) layer:
// the tiles of cached_attention, over a cache already holding their K and V. GMAC/s counts
// the multiply-adds of QK^T and PV over the visible positions (n (n + 1) / 2 per head each).
void PrefillAttention(benchmark::State& state, kestrel::model::AttentionShape shape) {
  const size_t n = static_cast<size_t>(state.range(0));
  kestrel::model::LayerCache c;
  c.capacity = n;
  c.stride = shape.n_kv_heads * shape.head_dim;
  for (auto* t : {&c.k, &c.v}) t->stride = c.stride, t->head_dim = shape.head_dim;
  c.k.half.resize(c.capacity * c.stride);
  c.v.half.resize(c.capacity * c.stride);
  const auto values = gaussian(4096);
  for (size_t i = 0; i < c.k.half.size(); ++i) {
    c.k.half[i] = kestrel::gguf::fp32_to_fp16(0.05f * values[i % values.size()]);
    c.v.half[i] = kestrel::gguf::fp32_to_fp16(values[(i * 7) % values.size()]);
  }
  const auto q = gaussian(n * shape.n_heads * shape.head_dim);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    kestrel::model::cached_attention(shape, q.data(), n, 0, c, out.data(), pool());
    benchmark::DoNotOptimize(out.data());
  }
  const double macs = 2.0 * static_cast<double>(shape.n_heads * shape.head_dim) * static_cast<double>(n) *
                      static_cast<double>(n + 1) / 2.0;
  state.counters["GMAC/s"] = benchmark::Counter(macs * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
// bf16_tiles set, as for layers with int8 activations: the bfloat16 tile where the CPU has
// AVX512-BF16 (Compute/PeakBf16Dot is then the ceiling); KESTREL_NO_BF16_ATTENTION=1 measures
// the float32 one.
BENCHMARK_CAPTURE(PrefillAttention, Gemma3_270M, kestrel::model::AttentionShape{4, 1, 256, 0, true})
    ->Name("Prefill/Attention/Gemma3-270M")->Arg(2048)->UseRealTime();
BENCHMARK_CAPTURE(PrefillAttention, E4B_global, kestrel::model::AttentionShape{8, 2, 512, 0, true})
    ->Name("Prefill/Attention/E4B-global")->Arg(1024)->UseRealTime();

// Memory bandwidth: all threads summing disjoint parts of a 1 GiB buffer (read-only, like a
// decode step streaming weights). The ceiling for decode is this over the bytes read per token.
void ReadBandwidth(benchmark::State& state) {
  const size_t n = size_t{1} << 28;  // floats: 1 GiB
  // Distinct contents in every page: a buffer of equal pages can be merged by the host (KSM, a
  // hypervisor's page sharing) into a few physical pages that the reads then find in cache (one
  // value everywhere measured 27-49 GB/s on the Zen 4 VM of docs/benchmarks.md).
  std::vector<float> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i % 65521) * 1e-6f;
  std::vector<double> partial(static_cast<size_t>(pool().size()));
  for (auto _ : state) {
    pool().parallel_for(n, 1 << 16, [&](size_t b, size_t e) {
      float acc[16] = {};
      for (size_t i = b; i + 16 <= e; i += 16) {
        for (int k = 0; k < 16; ++k) acc[k] += buf[i + static_cast<size_t>(k)];
      }
      double s = 0;
      for (float a : acc) s += a;
      partial[b / ((n + partial.size() - 1) / partial.size())] = s;
    });
    benchmark::DoNotOptimize(partial.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(n * sizeof(float)),
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(ReadBandwidth)->Name("Memory/ReadBandwidth")->UseRealTime()->Iterations(30);  // ~1 s: a shared host varies

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 warns inside _mm512_setzero_si512 (as in src/kestrel/kernels/gemv_q8_interleaved.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

// The peak bfloat16 multiply-accumulate rate: 12 independent chains of vdpbf16ps (32 MACs each)
// per thread, on registers only. The ceiling for a step that is compute-bound in the W4 kernels
// (several decode rows, speculative verification) is this over the MACs per step.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) double bf16_dot_chains(size_t n) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // 1.0
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3c00));  // 2^-7
  for (size_t i = 0; i < n; ++i) {
    for (auto& x : acc) x = _mm512_dpbf16_ps(x, a, b);
  }
  alignas(64) float lanes[16];
  double sum = 0;
  for (const auto& x : acc) {
    _mm512_store_ps(lanes, x);
    for (float l : lanes) sum += l;
  }
  return sum;
}

// Runs chains(kPeakIters) on every thread of the pool and reports GMAC/s, given the MACs one
// call does per iteration (the Compute/Peak* benchmarks).
constexpr size_t kPeakIters = 1 << 22;
template <class Chains>
void RunPeak(benchmark::State& state, Chains chains, size_t macs_per_iter) {
  const size_t threads = static_cast<size_t>(pool().size());
  std::vector<double> sink(threads);
  for (auto _ : state) {
    pool().parallel_for(threads, 1, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) sink[t] = chains(kPeakIters);
    });
    benchmark::DoNotOptimize(sink.data());
  }
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(threads * kPeakIters * macs_per_iter) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = static_cast<double>(threads);
}

void PeakBf16Dot(benchmark::State& state) {
  if (!k::bf16_dot_available()) {
    state.SkipWithError("this CPU has no AVX512-BF16");
    return;
  }
  RunPeak(state, bf16_dot_chains, 12 * 32);
}
BENCHMARK(PeakBf16Dot)->Name("Compute/PeakBf16Dot")->UseRealTime();

// The peak int8 multiply-accumulate rate of AVX512-VNNI: 12 independent chains of vpdpbusd
// (64 MACs each: 16 lanes x 4 u8 x s8 products) per thread, on registers only; with kFmas > 0,
// each step also issues that many float32 FMA chains (16 lanes each), to show whether the
// int8 kernels' float32 epilogue (a multiply and two FMAs per 8 vpdpbusd in gemv_w4_int8's
// 32-column formula) shares the pipes that run vpdpbusd; with kAdds > 0, that many vpaddd
// chains instead (the superblock formula's integer adds; Zen 4 runs them beside vpdpbusd).
template <int kFmas, int kAdds = 0>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double int8_dot_chains(size_t n) {
  __m512i acc[12], iacc[kAdds > 0 ? kAdds : 1];
  __m512 facc[kFmas > 0 ? kFmas : 1];
  for (auto& a : acc) a = _mm512_setzero_si512();
  for (auto& x : iacc) x = _mm512_setzero_si512();
  for (auto& f : facc) f = _mm512_setzero_ps();
  __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
  const __m512 fa = _mm512_set1_ps(1e-9f), fb = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (kAdds > 0) __asm__("" : "+v"(a), "+v"(b));  // no folding the adds across steps
    for (auto& x : acc) x = _mm512_dpbusd_epi32(x, a, b);
    for (int k = 0; k < kFmas; ++k) facc[k] = _mm512_fmadd_ps(fa, fb, facc[k]);
    for (int k = 0; k < kAdds; ++k) iacc[k] = _mm512_add_epi32(iacc[k], b);
  }
  alignas(64) int32_t lanes[16];
  double sum = 0;
  for (const auto& x : acc) {
    _mm512_store_si512(lanes, x);
    for (int32_t l : lanes) sum += l;
  }
  for (const auto& f : facc) sum += _mm512_reduce_add_ps(f);
  for (const auto& x : iacc) sum += _mm512_reduce_add_epi32(x);
  return sum;
}

// The peak float32 FMA rate (AVX-512: 12 independent chains of 16-lane FMAs per thread): the
// ceiling of the float32 attention kernels (Prefill/Attention).
__attribute__((target("avx512f"))) double fma_chains(size_t n) {
  __m512 acc[12];
  for (auto& f : acc) f = _mm512_setzero_ps();
  const __m512 fa = _mm512_set1_ps(1e-9f), fb = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; ++i) {
    for (auto& f : acc) f = _mm512_fmadd_ps(fa, fb, f);
  }
  double sum = 0;
  for (const auto& f : acc) sum += _mm512_reduce_add_ps(f);
  return sum;
}

void PeakFma(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx512f")) {
    state.SkipWithError("this CPU has no AVX-512");
    return;
  }
  RunPeak(state, fma_chains, 12 * 16);
}
BENCHMARK(PeakFma)->Name("Compute/PeakFma")->UseRealTime();

template <int kFmas, int kAdds = 0>
void PeakInt8Dot(benchmark::State& state) {
  if (!k::int8_isa_available(k::Int8Isa::kAvx512Vnni)) {
    state.SkipWithError("this CPU has no AVX512-VNNI (or KESTREL_NO_VNNI is set)");
    return;
  }
  RunPeak(state, int8_dot_chains<kFmas, kAdds>, 12 * 64);
}
BENCHMARK(PeakInt8Dot<0>)->Name("Compute/PeakInt8Dot")->UseRealTime();
BENCHMARK(PeakInt8Dot<4>)->Name("Compute/PeakInt8Dot+4Fma")->UseRealTime();
BENCHMARK(PeakInt8Dot<0, 4>)->Name("Compute/PeakInt8Dot+4Add")->UseRealTime();

// The peak int8 multiply-accumulate rate of AVX2 as gemv_w4_int8's AVX2 path spends it: per
// step 12 independent chains of vpmaddubsw (32 u8 x s8 products, summed in pairs to int16) each
// added into its int16 accumulator by vpaddw, on registers only. The ceiling of the INT4 layers
// with int8 activations on an AVX2-only CPU (Zen 1: vpmaddubsw ymm issues once per two cycles).
__attribute__((target("avx2"))) double int8_dot_chains_avx2(size_t n) {
  __m256i acc[12];
  for (auto& a : acc) a = _mm256_setzero_si256();
  __m256i a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(2);
  for (size_t i = 0; i < n; ++i) {
    __asm__("" : "+x"(a), "+x"(b));  // no hoisting the products out of the loop
    for (auto& x : acc) x = _mm256_add_epi16(x, _mm256_maddubs_epi16(a, b));
  }
  alignas(32) int16_t lanes[16];
  double sum = 0;
  for (const auto& x : acc) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), x);
    for (int16_t l : lanes) sum += l;
  }
  return sum;
}

void PeakInt8DotAvx2(benchmark::State& state) {
  if (!k::int8_isa_available(k::Int8Isa::kAvx2)) {
    state.SkipWithError("this CPU has no AVX2");
    return;
  }
  RunPeak(state, int8_dot_chains_avx2, 12 * 32);
}
BENCHMARK(PeakInt8DotAvx2)->Name("Compute/PeakInt8DotAvx2")->UseRealTime();

// AMX-BF16's ceiling (the prefill tiles, gemm_w4_amx_bf16.h): four independent accumulator
// tiles, each `tdpbf16ps` 16 x 16 x 32 multiply-adds on operands already in tiles.
struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
__attribute__((target("amx-tile,amx-bf16"))) double amx_bf16_chains(size_t n) {
  AmxConfig c;
  for (size_t i = 0; i < 8; ++i) c.rows[i] = 16, c.colsb[i] = 64;
  _tile_loadconfig(&c);
  alignas(64) static const uint16_t ones[16 * 32] = {};
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (size_t i = 0; i < n / 16; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

void PeakAmxBf16(benchmark::State& state) {
  if (!k::amx_bf16_available()) {
    state.SkipWithError("this CPU or OS has no AMX-BF16");
    return;
  }
  RunPeak(state, amx_bf16_chains, 4 * 16 * 16 * 32 / 16);
}
BENCHMARK(PeakAmxBf16)->Name("Compute/PeakAmxBf16")->UseRealTime();
#endif

}  // namespace

BENCHMARK_MAIN();
