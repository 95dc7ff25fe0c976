// Highway implementation of the per-vector ops; compiled once per SIMD target.
#include "kestrel/kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/x86_sums.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kestrel/kernels/ops.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kestrel::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float SumSquares(const float* x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto acc = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    acc = hn::MulAdd(v, v, acc);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

float DotF16(const float* q, const hwy::float16_t* k, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  auto acc = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    acc = hn::MulAdd(hn::LoadU(d, q + i), hn::PromoteTo(d, hn::LoadU(dh, k + i)), acc);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) s += q[i] * gguf::fp16_to_fp32(reinterpret_cast<const uint16_t*>(k)[i]);
  return s;
}

// out += w * v (fp16 v).
void AxpyF16(float w, const hwy::float16_t* v, float* out, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  const auto wv = hn::Set(d, w);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::MulAdd(wv, hn::PromoteTo(d, hn::LoadU(dh, v + i)), hn::LoadU(d, out + i)), d,
               out + i);
  }
  for (; i < n; ++i) out[i] += w * gguf::fp16_to_fp32(reinterpret_cast<const uint16_t*>(v)[i]);
}

// scores[0..n) = exp(scores - max), vectorized (Highway's Exp, ~1 ulp); returns the sum and
// writes the max.
float ExpShifted(float* scores, size_t n, float* max_out) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  float max_score = -INFINITY;
  size_t m = 0;
  if (n >= N) {  // the maximum is exact in any order
    auto vm = hn::LoadU(d, scores);
    for (m = N; m + N <= n; m += N) vm = hn::Max(vm, hn::LoadU(d, scores + m));
    max_score = hn::GetLane(hn::MaxOfLanes(d, vm));
  }
  for (; m < n; ++m) max_score = std::max(max_score, scores[m]);
  const auto vmax = hn::Set(d, max_score);
  auto vsum = hn::Zero(d);
  size_t j = 0;
  for (; j + N <= n; j += N) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, scores + j), vmax));
    hn::StoreU(e, d, scores + j);
    vsum = hn::Add(vsum, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
  for (; j < n; ++j) sum += scores[j] = std::exp(scores[j] - max_score);
  *max_out = max_score;
  return sum;
}

// Rows of K or V ahead of the one being read whose bytes are prefetched. One head's row is a
// short run (head_dim halves) inside a longer slot (all KV heads), so the hardware prefetchers,
// which stop at 4 KiB pages, lose the stream at every page: decode attention over 3,072
// positions of a global E4B layer read its cache at 6.5-8 GB/s without this
// (build/bench/kestrel_kernels_bench --benchmark_filter=Attention).
constexpr size_t kPrefetchRows = 8;

// Prefetches the head_dim halves of cache row `row` (its slot) into L1.
inline void PrefetchRow(const hwy::float16_t* base, size_t row, size_t capacity, size_t stride,
                        size_t head_dim) {
  const auto* p = reinterpret_cast<const char*>(base + (row % capacity) * stride);
  for (size_t b = 0; b < head_dim * sizeof(uint16_t); b += 64) __builtin_prefetch(p + b);
}

// AttendBlock's two passes, for a number of queries known at compile time where it can be, so
// that the per-query accumulators stay in registers (with a run-time count the compiler keeps
// them on the stack: a load and a store per multiply-add). Scores: each K row once for all NQ
// queries. Values: blocks of kValueRows rows; per 16-lane chunk of head_dim the NQ outputs are
// loaded once, take the block's rows in order, and are stored once.
constexpr size_t kValueRows = 16;

// Independent multiply-add chains a decode loop keeps in flight (rows in BlockScores, column
// chunks in BlockValues) for NQ queries: a chain's multiply-add waits on its previous one (4
// cycles on Zen 3 against 2 issued a cycle), so one row at a time for 4 queries waited on
// latency; 2 or 4 at once fit AVX2's 16 vector registers. Each chain keeps its order.
template <size_t NQ>
constexpr size_t kChains = NQ == 0 || NQ > 4 ? 1 : NQ <= 2 ? 4 : 2;

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Scores of 4 queries against cache rows j0..j0+3: a 4 x 4 tile of dot products (each K and Q
// chunk loaded once for 4 products), reduced together by sums_of_16 (x86_sums.h). Row r comes
// from krows[r] (fp16) or, when kf is given, from kf + r * head_dim (the rows already converted).
inline void ScoresTile4x4(const float* const* qs, const hwy::float16_t* const* krows, const float* kf,
                          size_t head_dim, float* const* score_rows) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  constexpr size_t N = 16;
  decltype(hn::Zero(d)) acc[16];
  for (auto& a : acc) a = hn::Zero(d);
  for (size_t c = 0; c < head_dim; c += N) {
    decltype(hn::Zero(d)) kv[4];
    for (size_t r = 0; r < 4; ++r) {
      kv[r] = kf != nullptr ? hn::LoadU(d, kf + r * head_dim + c) : hn::PromoteTo(d, hn::LoadU(dh, krows[r] + c));
    }
    for (size_t i = 0; i < 4; ++i) {
      const auto qv = hn::LoadU(d, qs[i] + c);
      for (size_t r = 0; r < 4; ++r) acc[4 * r + i] = hn::MulAdd(qv, kv[r], acc[4 * r + i]);
    }
  }
  __m512 raw[16];
  for (size_t i = 0; i < 16; ++i) raw[i] = acc[i].raw;
  const __m512 sums = sums_of_16(raw);  // lane i: query i, rows 0..3
  _mm_storeu_ps(score_rows[0], _mm512_castps512_ps128(sums));
  _mm_storeu_ps(score_rows[1], _mm512_extractf32x4_ps(sums, 1));
  _mm_storeu_ps(score_rows[2], _mm512_extractf32x4_ps(sums, 2));
  _mm_storeu_ps(score_rows[3], _mm512_extractf32x4_ps(sums, 3));
}
#endif

// The largest head_dim whose K rows BlockScores converts ahead into a stack buffer.
constexpr size_t kMaxConvertedHeadDim = 512;

// NQ = 0: the count is n_q (at most kMaxBlockQueries), known only at run time.
template <size_t NQ>
void BlockScores(const float* const* qs, size_t n_q, const hwy::float16_t* kh, size_t lo, size_t n,
                 size_t stride, size_t capacity, size_t head_dim, float* scores) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  const size_t count = NQ != 0 ? NQ : n_q;
  size_t j = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // Prefill tiles (8 or 16 queries): 4 x 4 tiles (rows x queries), the same products and
  // reduction tree, so the same bits as below; the 4 rows are converted from fp16 once for all
  // the query quadruples. Prefill attention of 2,048 tokens, Gemma 3 270M's shape: 61 -> 80
  // GMAC/s on 2 Zen 4 cores (Prefill/Attention). Decode (4 queries or fewer, bound by reading
  // the cache) keeps the row loop, measured no faster tiled.
  if constexpr (NQ >= 8 && NQ % 4 == 0) {
    alignas(64) float kf[4 * kMaxConvertedHeadDim];
    const bool convert = head_dim <= kMaxConvertedHeadDim;
    for (; j + 4 <= n; j += 4) {
      const hwy::float16_t* krows[4];
      for (size_t r = 0; r < 4; ++r) {
        krows[r] = kh + ((lo + j + r) % capacity) * stride;
        if (j + r + kPrefetchRows < n) PrefetchRow(kh, lo + j + r + kPrefetchRows, capacity, stride, head_dim);
      }
      if (convert) {
        for (size_t r = 0; r < 4; ++r) {
          for (size_t c = 0; c < head_dim; c += N) {
            hn::Store(hn::PromoteTo(d, hn::LoadU(dh, krows[r] + c)), d, kf + r * head_dim + c);
          }
        }
      }
      for (size_t q0 = 0; q0 < NQ; q0 += 4) {
        float* rows[4];
        for (size_t i = 0; i < 4; ++i) rows[i] = scores + (q0 + i) * n + j;
        ScoresTile4x4(qs + q0, krows, convert ? kf : nullptr, head_dim, rows);
      }
    }
  }
#endif
  // Decode (4 queries or fewer): kChains<NQ> rows at a time, each (row, query) chain summing in
  // column order as below (the same bits), so that several multiply-add chains are in flight.
  if constexpr (kChains<NQ> > 1) {
    constexpr size_t R = kChains<NQ>;
    for (; j + R <= n; j += R) {
      const hwy::float16_t* krows[R];
      for (size_t r = 0; r < R; ++r) {
        krows[r] = kh + ((lo + j + r) % capacity) * stride;
        if (j + r + kPrefetchRows < n) PrefetchRow(kh, lo + j + r + kPrefetchRows, capacity, stride, head_dim);
      }
      decltype(hn::Zero(d)) acc[R][NQ];
      for (size_t r = 0; r < R; ++r) {
        for (size_t i = 0; i < NQ; ++i) acc[r][i] = hn::Zero(d);
      }
      for (size_t c = 0; c < head_dim; c += N) {
        decltype(hn::Zero(d)) kv[R];
        for (size_t r = 0; r < R; ++r) kv[r] = hn::PromoteTo(d, hn::LoadU(dh, krows[r] + c));
        for (size_t i = 0; i < NQ; ++i) {
          const auto qv = hn::LoadU(d, qs[i] + c);
          for (size_t r = 0; r < R; ++r) acc[r][i] = hn::MulAdd(qv, kv[r], acc[r][i]);
        }
      }
      for (size_t r = 0; r < R; ++r) {
        for (size_t i = 0; i < NQ; ++i) scores[i * n + j + r] = hn::GetLane(hn::SumOfLanes(d, acc[r][i]));
      }
    }
  }
  for (; j < n; ++j) {
    const hwy::float16_t* krow = kh + ((lo + j) % capacity) * stride;
    if (j + kPrefetchRows < n) PrefetchRow(kh, lo + j + kPrefetchRows, capacity, stride, head_dim);
    decltype(hn::Zero(d)) acc[NQ != 0 ? NQ : kMaxBlockQueries];
    for (size_t i = 0; i < count; ++i) acc[i] = hn::Zero(d);
    for (size_t c = 0; c < head_dim; c += N) {
      const auto kv = hn::PromoteTo(d, hn::LoadU(dh, krow + c));
      for (size_t i = 0; i < count; ++i) acc[i] = hn::MulAdd(hn::LoadU(d, qs[i] + c), kv, acc[i]);
    }
    for (size_t i = 0; i < count; ++i) scores[i * n + j] = hn::GetLane(hn::SumOfLanes(d, acc[i]));
  }
}

template <size_t NQ>
void BlockValues(const float* scores, size_t n_q, const hwy::float16_t* vh, size_t lo, size_t n,
                 size_t stride, size_t capacity, size_t head_dim, float* const* outs) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  const size_t count = NQ != 0 ? NQ : n_q;
  for (size_t jb = 0; jb < n; jb += kValueRows) {
    const size_t je = std::min(n, jb + kValueRows);
    // The next block's rows are prefetched one per column pass, not all at the block's start:
    // 16 rows at once (128 lines for Gemma 3's heads) overran the core's miss buffers, and the
    // loop stalled on the prefetches (decode attention at 32,704 positions, one Zen 3 thread:
    // 5.7 -> 4.6 ms).
    const size_t pf_end = std::min(n, je + kValueRows);
    size_t pf = je;
    const hwy::float16_t* rows[kValueRows];  // the slot arithmetic (a division) once per row
    for (size_t j = jb; j < je; ++j) rows[j - jb] = vh + ((lo + j) % capacity) * stride;
    size_t c = 0;
    if constexpr (kChains<NQ> > 1) {  // kChains<NQ> column chunks at a time (the same bits)
      constexpr size_t C = kChains<NQ>;
      for (; c + C * N <= head_dim; c += C * N) {
        if (pf < pf_end) PrefetchRow(vh, lo + pf++, capacity, stride, head_dim);
        decltype(hn::Zero(d)) acc[C][NQ];
        for (size_t b = 0; b < C; ++b) {
          for (size_t i = 0; i < NQ; ++i) acc[b][i] = hn::LoadU(d, outs[i] + c + b * N);
        }
        for (size_t j = jb; j < je; ++j) {
          decltype(hn::Zero(d)) vv[C];
          for (size_t b = 0; b < C; ++b) vv[b] = hn::PromoteTo(d, hn::LoadU(dh, rows[j - jb] + c + b * N));
          for (size_t i = 0; i < NQ; ++i) {
            const auto p = hn::Set(d, scores[i * n + j]);
            for (size_t b = 0; b < C; ++b) acc[b][i] = hn::MulAdd(p, vv[b], acc[b][i]);
          }
        }
        for (size_t b = 0; b < C; ++b) {
          for (size_t i = 0; i < NQ; ++i) hn::StoreU(acc[b][i], d, outs[i] + c + b * N);
        }
      }
    }
    for (; pf < pf_end; ++pf) PrefetchRow(vh, lo + pf, capacity, stride, head_dim);  // rows left over
    for (; c < head_dim; c += N) {
      decltype(hn::Zero(d)) acc[NQ != 0 ? NQ : kMaxBlockQueries];
      for (size_t i = 0; i < count; ++i) acc[i] = hn::LoadU(d, outs[i] + c);
      for (size_t j = jb; j < je; ++j) {
        const auto vv = hn::PromoteTo(d, hn::LoadU(dh, rows[j - jb] + c));
        for (size_t i = 0; i < count; ++i) acc[i] = hn::MulAdd(hn::Set(d, scores[i * n + j]), vv, acc[i]);
      }
      for (size_t i = 0; i < count; ++i) hn::StoreU(acc[i], d, outs[i] + c);
    }
  }
}

// f(std::integral_constant<size_t, n_q>{}) for the query counts with kernels of their own
// (decode: the query heads of one KV head; whole prefill tiles), else with 0 (a run-time count).
template <class F>
void WithQueryCount(size_t n_q, F&& f) {
  switch (n_q) {
    case 1: f(std::integral_constant<size_t, 1>{}); break;
    case 2: f(std::integral_constant<size_t, 2>{}); break;
    case 4: f(std::integral_constant<size_t, 4>{}); break;
    case 8: f(std::integral_constant<size_t, 8>{}); break;
    case 16: f(std::integral_constant<size_t, 16>{}); break;
    default: f(std::integral_constant<size_t, 0>{}); break;
  }
}

// The `group` query heads that share one KV head (GQA): each cached K and V row is loaded and
// converted from fp16 once for all of them. Writes the unnormalized partial result of the
// range: out = sum_j exp(s_j - max) v_j, with max and sum = sum_j exp(s_j - max) per head.
// Group sizes with a kernel of their own (1, 2, 4, 8, 16) keep their accumulators in registers
// (BlockScores / BlockValues); per output element the multiply-adds run in the same order
// (positions ascending, from zero) whatever the group size, so a head's result does not depend
// on the path.
void AttendGroup(const float* q, size_t group, const uint16_t* k, const uint16_t* v, size_t stride,
                 size_t capacity, size_t head_dim, size_t pos_begin, size_t pos_end,
                 float* scores, float* out, float* max_out, float* sum_out) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto* kh = reinterpret_cast<const hwy::float16_t*>(k);
  const auto* vh = reinterpret_cast<const hwy::float16_t*>(v);
  const size_t n = pos_end - pos_begin;
  if (group > kMaxBlockQueries || head_dim % N != 0) {  // general path, one head at a time
    for (size_t h = 0; h < group; ++h) {
      float* s = scores + h * n;
      for (size_t j = 0; j < n; ++j) {
        s[j] = DotF16(q + h * head_dim, kh + ((pos_begin + j) % capacity) * stride, head_dim);
      }
      sum_out[h] = ExpShifted(s, n, &max_out[h]);
      for (size_t i = 0; i < head_dim; ++i) out[h * head_dim + i] = 0.0f;
      for (size_t j = 0; j < n; ++j) {
        AxpyF16(s[j], vh + ((pos_begin + j) % capacity) * stride, out + h * head_dim, head_dim);
      }
    }
    return;
  }
  const float* qs[kMaxBlockQueries];
  float* outs[kMaxBlockQueries];
  for (size_t h = 0; h < group; ++h) qs[h] = q + h * head_dim, outs[h] = out + h * head_dim;
  WithQueryCount(group, [&](auto nq) {
    BlockScores<decltype(nq)::value>(qs, group, kh, pos_begin, n, stride, capacity, head_dim, scores);
  });
  for (size_t h = 0; h < group; ++h) sum_out[h] = ExpShifted(scores + h * n, n, &max_out[h]);
  for (size_t i = 0; i < group * head_dim; ++i) out[i] = 0.0f;
  WithQueryCount(group, [&](auto nq) {
    BlockValues<decltype(nq)::value>(scores, group, vh, pos_begin, n, stride, capacity, head_dim, outs);
  });
}

// Prefill tile: n_q query vectors (consecutive tokens x the heads of one KV head), query i
// seeing positions [begins[i], ends[i]). Each K and V row of the union of the ranges is
// converted once and used by every query that sees it.
void AttendBlock(const float* const* qs, size_t n_q, const size_t* begins, const size_t* ends,
                 const uint16_t* k, const uint16_t* v, size_t stride, size_t capacity,
                 size_t head_dim, float* scores, float* const* outs) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto* kh = reinterpret_cast<const hwy::float16_t*>(k);
  const auto* vh = reinterpret_cast<const hwy::float16_t*>(v);
  size_t lo = begins[0], hi = ends[0];
  for (size_t i = 1; i < n_q; ++i) {
    lo = std::min(lo, begins[i]);
    hi = std::max(hi, ends[i]);
  }
  const size_t n = hi - lo;
  WithQueryCount(n_q, [&](auto nq) {
    BlockScores<decltype(nq)::value>(qs, n_q, kh, lo, n, stride, capacity, head_dim, scores);
  });
  float inv_sum[kMaxBlockQueries];
  for (size_t i = 0; i < n_q; ++i) {
    float* s = scores + i * n;
    float mx;
    const size_t b = begins[i] - lo, e = ends[i] - lo;
    inv_sum[i] = 1.0f / ExpShifted(s + b, e - b, &mx);
    for (size_t j = 0; j < b; ++j) s[j] = 0.0f;
    for (size_t j = e; j < n; ++j) s[j] = 0.0f;
    for (size_t c = 0; c < head_dim; ++c) outs[i][c] = 0.0f;
  }
  WithQueryCount(n_q, [&](auto nq) {
    BlockValues<decltype(nq)::value>(scores, n_q, vh, lo, n, stride, capacity, head_dim, outs);
  });
  for (size_t i = 0; i < n_q; ++i) {
    for (size_t c = 0; c < head_dim; c += N) {
      hn::StoreU(hn::Mul(hn::LoadU(d, outs[i] + c), hn::Set(d, inv_sum[i])), d, outs[i] + c);
    }
  }
}

// float32 -> fp16, rounded to nearest even. On x86 targets from AVX2 up, F16C's vcvtps2ph (the
// IEEE rounding of gguf::fp32_to_fp16, bit for bit); elsewhere that function.
void ToFp16(const float* x, uint16_t* y, size_t n) {
  size_t i = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  auto* yh = reinterpret_cast<hwy::float16_t*>(y);
  for (; i + N <= n; i += N) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(d, x + i)), dh, yh + i);
#endif
  for (; i < n; ++i) y[i] = gguf::fp32_to_fp16(x[i]);
}

double SumExpShifted(const float* x, size_t n, double shift) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t N = hn::Lanes(dd);
  const auto vshift = hn::Set(dd, shift);
  const auto floor = hn::Set(dd, -745.0);  // exp below underflows to 0 (and -inf is outside Exp's range)
  auto acc0 = hn::Zero(dd), acc1 = hn::Zero(dd);
  auto term = [&](const float* p) {
    const auto v = hn::Sub(hn::PromoteTo(dd, hn::LoadU(df, p)), vshift);
    return hn::IfThenElseZero(hn::Gt(v, floor), hn::Exp(dd, hn::Max(v, floor)));
  };
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    acc0 = hn::Add(acc0, term(x + i));
    acc1 = hn::Add(acc1, term(x + i + N));
  }
  double sum = hn::GetLane(hn::SumOfLanes(dd, hn::Add(acc0, acc1)));
  for (; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - shift);
  return sum;
}

void GeluTanhMul(const float* gate, const float* up, float* y, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto c0 = hn::Set(d, 0.7978845608028654f), c1 = hn::Set(d, 0.044715f);
  const auto half = hn::Set(d, 0.5f), one = hn::Set(d, 1.0f);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto g = hn::LoadU(d, gate + i);
    const auto inner = hn::Mul(hn::Mul(c0, g), hn::MulAdd(hn::Mul(c1, g), g, one));
    const auto gelu = hn::Mul(hn::Mul(half, g), hn::Add(one, hn::Tanh(d, inner)));
    hn::StoreU(hn::Mul(gelu, hn::LoadU(d, up + i)), d, y + i);
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    y[i] = 0.5f * g * (1.0f + std::tanh(0.7978845608028654f * g * (1.0f + 0.044715f * g * g))) * up[i];
  }
}

void Softcap(float* z, size_t n, float cap) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vcap = hn::Set(d, cap), inv = hn::Set(d, 1.0f / cap);
  const auto capped = [&](auto v) { return hn::Mul(vcap, hn::Tanh(d, hn::Mul(v, inv))); };
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(capped(hn::LoadU(d, z + i)), d, z + i);
  if (i < n) {  // the tail through the same vector code, so its bits match a full vector's
    float tail[HWY_MAX_BYTES / sizeof(float)] = {};
    std::copy(z + i, z + n, tail);
    hn::StoreU(capped(hn::LoadU(d, tail)), d, tail);
    std::copy(tail, tail + (n - i), z + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kestrel::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kestrel::kernels {

HWY_EXPORT(SumSquares);
HWY_EXPORT(AttendGroup);
HWY_EXPORT(AttendBlock);
HWY_EXPORT(ExpShifted);
HWY_EXPORT(SumExpShifted);
HWY_EXPORT(GeluTanhMul);
HWY_EXPORT(Softcap);
HWY_EXPORT(ToFp16);

void rms_norm(const float* x, const float* weight, float* y, size_t n, float eps) {
  const float mean = HWY_DYNAMIC_DISPATCH(SumSquares)(x, n) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(mean + eps);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * inv * weight[i];
}

void rms_norm_unweighted(const float* x, float* y, size_t n, float eps) {
  const float mean = HWY_DYNAMIC_DISPATCH(SumSquares)(x, n) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(mean + eps);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * inv;
}

void gelu_tanh_mul(const float* gate, const float* up, float* y, size_t n) {
  HWY_DYNAMIC_DISPATCH(GeluTanhMul)(gate, up, y, n);
}

void softcap(float* z, size_t n, float cap) {
  if (!(cap > 0.0f)) throw Error("softcap: the cap must be positive");
  HWY_DYNAMIC_DISPATCH(Softcap)(z, n, cap);
}

void add_inplace(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] *= s;
}

void rope_neox(float* x, size_t n_heads, size_t head_dim, size_t n_rot, const float* cos_sin) {
  const size_t half = n_rot / 2;
  for (size_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (size_t i = 0; i < half; ++i) {
      const float c = cos_sin[2 * i];
      const float s = cos_sin[2 * i + 1];
      const float a = v[i];
      const float b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = a * s + b * c;
    }
  }
}

void to_fp16(const float* x, uint16_t* y, size_t n) { HWY_DYNAMIC_DISPATCH(ToFp16)(x, y, n); }

double sum_exp_shifted(const float* x, size_t n, double shift) {
  return HWY_DYNAMIC_DISPATCH(SumExpShifted)(x, n, shift);
}

float exp_shifted(float* scores, size_t n, float* max_out) {
  return HWY_DYNAMIC_DISPATCH(ExpShifted)(scores, n, max_out);
}

void attend(const float* q, const uint16_t* k, const uint16_t* v, size_t stride, size_t capacity,
            size_t head_dim, size_t pos_begin, size_t pos_end, float* scores, float* out) {
  attend_group(q, 1, k, v, stride, capacity, head_dim, pos_begin, pos_end, scores, out);
}

void attend_group(const float* q, size_t group, const uint16_t* k, const uint16_t* v,
                  size_t stride, size_t capacity, size_t head_dim, size_t pos_begin,
                  size_t pos_end, float* scores, float* out) {
  float max_score[64], sum[64];
  if (group > 64) throw Error("attend_group: more than 64 query heads per KV head");
  HWY_DYNAMIC_DISPATCH(AttendGroup)(q, group, k, v, stride, capacity, head_dim, pos_begin,
                                    pos_end, scores, out, max_score, sum);
  for (size_t h = 0; h < group; ++h) scale_inplace(out + h * head_dim, 1.0f / sum[h], head_dim);
}

void attend_block(const float* const* queries, size_t n_queries, const size_t* begins,
                  const size_t* ends, const uint16_t* k, const uint16_t* v, size_t stride,
                  size_t capacity, size_t head_dim, float* scores, float* const* outs) {
  if (n_queries == 0 || n_queries > kMaxBlockQueries || head_dim % 16 != 0) {
    throw Error("attend_block: 1 to 16 queries of a head_dim divisible by 16");
  }
  HWY_DYNAMIC_DISPATCH(AttendBlock)(queries, n_queries, begins, ends, k, v, stride, capacity,
                                    head_dim, scores, outs);
}

void attend_partial(const float* q, size_t group, const uint16_t* k, const uint16_t* v,
                    size_t stride, size_t capacity, size_t head_dim, size_t pos_begin,
                    size_t pos_end, float* scores, AttentionPartial* partial) {
  HWY_DYNAMIC_DISPATCH(AttendGroup)(q, group, k, v, stride, capacity, head_dim, pos_begin,
                                    pos_end, scores, partial->out, partial->max, partial->sum);
}

void merge_partials(const AttentionPartial* parts, size_t n_parts, size_t group, size_t head_dim,
                    float* out) {
  for (size_t h = 0; h < group; ++h) {
    float m = -INFINITY;
    for (size_t p = 0; p < n_parts; ++p) m = std::max(m, parts[p].max[h]);
    float total = 0.0f;
    float* o = out + h * head_dim;
    for (size_t i = 0; i < head_dim; ++i) o[i] = 0.0f;
    for (size_t p = 0; p < n_parts; ++p) {
      const float w = std::exp(parts[p].max[h] - m);
      total += w * parts[p].sum[h];
      for (size_t i = 0; i < head_dim; ++i) o[i] += w * parts[p].out[h * head_dim + i];
    }
    scale_inplace(o, 1.0f / total, head_dim);
  }
}

}  // namespace kestrel::kernels
#endif  // HWY_ONCE
