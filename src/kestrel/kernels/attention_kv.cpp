// Highway implementation of attention over typed (f16 / bf16 / q8) K and V caches; compiled once
// per SIMD target. The plan follows ops.cpp's fp16 kernels (a tile of queries reads each K and V
// row once; scores, a softmax per query, values in position order), with the row loads made
// type-aware: q8 rows are widened from int8 and multiplied by their block's scale in registers,
// so decode reads one byte per element (plus a scale per block) instead of two.
#include "kestrel/kernels/attention_kv.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/ops.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kestrel/kernels/attention_kv.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#ifndef KESTREL_ATTENTION_KV_ONCE
#define KESTREL_ATTENTION_KV_ONCE
namespace kestrel::kernels {
namespace {
// The largest head a row's q8 scales are gathered for (512 / the smallest block of 32 = 16;
// smaller blocks only come with smaller heads).
constexpr size_t kMaxRowScales = 64;
// Rows ahead whose bytes are prefetched (ops.cpp's kPrefetchRows: one head's row is a short run
// inside a slot of all heads, which the hardware prefetchers lose at page boundaries).
constexpr size_t kPrefetchAhead = 8;
// Value rows taken per pass over a query's output chunk.
constexpr size_t kValueRowsKv = 16;
}  // namespace
}  // namespace kestrel::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace kestrel::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A row of a typed view: its elements and, for q8, its block scales as float32.
struct RowRef {
  const void* p;
  float scales[kMaxRowScales];
};

inline const void* RowPtr(const KvHeadView& v, size_t slot) {
  const size_t bytes = v.type == KvType::kQ8 ? 1 : 2;
  return static_cast<const char*>(v.data) + slot * v.stride * bytes;
}

inline void Prefetch(const KvHeadView& v, size_t slot, size_t head_dim) {
  const auto* p = static_cast<const char*>(RowPtr(v, slot));
  const size_t bytes = head_dim * (v.type == KvType::kQ8 ? 1 : 2);
  for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}

template <KvType T>
inline void Bind(const KvHeadView& v, size_t slot, size_t head_dim, RowRef& r) {
  r.p = RowPtr(v, slot);
  if constexpr (T == KvType::kQ8) {
    // The row's block scales widened by the vector unit (F16C's vcvtph2ps on x86: exact, as
    // gguf::fp16_to_fp32 is), eight at a time: a call per scale was a third of a 32k decode step.
    const auto* s = reinterpret_cast<const hwy::float16_t*>(v.scales + slot * v.scale_stride);
    const size_t nb = head_dim / v.block;
    const hn::CappedTag<float, 8> d8;
    const hn::Rebind<hwy::float16_t, decltype(d8)> dh8;
    const size_t N8 = hn::Lanes(d8);
    size_t b = 0;
    for (; b + N8 <= nb; b += N8) hn::StoreU(hn::PromoteTo(d8, hn::LoadU(dh8, s + b)), d8, r.scales + b);
    for (; b < nb; ++b) r.scales[b] = gguf::fp16_to_fp32(v.scales[slot * v.scale_stride + b]);
  }
}

// Elements c .. c + Lanes(d) of a bound row as float32 (for q8, within one block: the caller
// keeps Lanes(d) | block).
template <KvType T, class D>
HWY_INLINE hn::Vec<D> LoadKv(D d, const RowRef& r, size_t shift, size_t c) {
  if constexpr (T == KvType::kF16) {
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, static_cast<const hwy::float16_t*>(r.p) + c));
  } else if constexpr (T == KvType::kBF16) {
    const hn::Rebind<hwy::bfloat16_t, D> db;
    return hn::PromoteTo(d, hn::LoadU(db, static_cast<const hwy::bfloat16_t*>(r.p) + c));
  } else {
    const hn::Rebind<int8_t, D> d8;
    const hn::Rebind<int32_t, D> di;
    const auto x = hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, static_cast<const int8_t*>(r.p) + c)));
    return hn::Mul(x, hn::Set(d, r.scales[c >> shift]));
  }
}

inline size_t Log2(size_t x) {
  size_t s = 0;
  while ((size_t{1} << s) < x) ++s;
  return s;
}

// Independent float32 chains a loop keeps in flight: one per query and row (Scores) or per query
// and column chunk (Values). A chain's fused multiply-add waits for the previous one (4 cycles
// on Zen 3, against 2 a cycle issued), so one row (or chunk) at a time for 4 queries left the
// loop waiting on latency: two or four at once, each chain still summing in its own order
// (the same bits), within the 16 vector registers of AVX2.
template <size_t NQ>
constexpr size_t kChains = NQ == 0 || NQ > 4 ? 1 : NQ <= 2 ? 4 : 2;

// Scores of `count` (NQ when known) queries against rows lo .. lo + n: scores[i * n + j]; each
// score sums its head_dim products in column order. kChains<NQ> rows at a time.
template <KvType KT, size_t NQ>
void Scores(const float* const* qs, size_t n_q, const KvHeadView& k, size_t capacity, size_t lo, size_t n,
            size_t head_dim, float* scores) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t count = NQ != 0 ? NQ : n_q;
  const size_t shift = Log2(k.block);
  constexpr size_t R = kChains<NQ>;
  constexpr size_t kQ = NQ != 0 ? NQ : kMaxBlockQueries;
  RowRef r[R];
  size_t j = 0;
  for (; j + R <= n; j += R) {
    for (size_t a = 0; a < R; ++a) {
      Bind<KT>(k, (lo + j + a) % capacity, head_dim, r[a]);
      if (j + a + kPrefetchAhead < n) Prefetch(k, (lo + j + a + kPrefetchAhead) % capacity, head_dim);
    }
    decltype(hn::Zero(d)) acc[R][kQ];
    for (size_t a = 0; a < R; ++a) {
      for (size_t i = 0; i < count; ++i) acc[a][i] = hn::Zero(d);
    }
    for (size_t c = 0; c < head_dim; c += N) {
      decltype(hn::Zero(d)) kv[R];
      for (size_t a = 0; a < R; ++a) kv[a] = LoadKv<KT>(d, r[a], shift, c);
      for (size_t i = 0; i < count; ++i) {
        const auto qv = hn::LoadU(d, qs[i] + c);
        for (size_t a = 0; a < R; ++a) acc[a][i] = hn::MulAdd(qv, kv[a], acc[a][i]);
      }
    }
    for (size_t a = 0; a < R; ++a) {
      for (size_t i = 0; i < count; ++i) scores[i * n + j + a] = hn::GetLane(hn::SumOfLanes(d, acc[a][i]));
    }
  }
  for (; j < n; ++j) {
    Bind<KT>(k, (lo + j) % capacity, head_dim, r[0]);
    if (j + kPrefetchAhead < n) Prefetch(k, (lo + j + kPrefetchAhead) % capacity, head_dim);
    decltype(hn::Zero(d)) acc[kQ];
    for (size_t i = 0; i < count; ++i) acc[i] = hn::Zero(d);
    for (size_t c = 0; c < head_dim; c += N) {
      const auto kv = LoadKv<KT>(d, r[0], shift, c);
      for (size_t i = 0; i < count; ++i) acc[i] = hn::MulAdd(hn::LoadU(d, qs[i] + c), kv, acc[i]);
    }
    for (size_t i = 0; i < count; ++i) scores[i * n + j] = hn::GetLane(hn::SumOfLanes(d, acc[i]));
  }
}

// outs[i] += sum_j scores[i * n + j] v(lo + j), positions in order (each output element one
// chain over the positions). kChains<NQ> column chunks at a time.
template <KvType VT, size_t NQ>
void Values(const float* scores, size_t n_q, const KvHeadView& v, size_t capacity, size_t lo, size_t n,
            size_t head_dim, float* const* outs) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t count = NQ != 0 ? NQ : n_q;
  const size_t shift = Log2(v.block);
  constexpr size_t C = kChains<NQ>;
  constexpr size_t kQ = NQ != 0 ? NQ : kMaxBlockQueries;
  RowRef rows[kValueRowsKv];
  for (size_t jb = 0; jb < n; jb += kValueRowsKv) {
    const size_t je = std::min(n, jb + kValueRowsKv);
    const size_t pf_end = std::min(n, je + kValueRowsKv);
    size_t pf = je;  // the next block's rows, one per column pass (ops.cpp's BlockValues)
    for (size_t j = jb; j < je; ++j) Bind<VT>(v, (lo + j) % capacity, head_dim, rows[j - jb]);
    size_t c = 0;
    for (; c + C * N <= head_dim; c += C * N) {
      if (pf < pf_end) Prefetch(v, (lo + pf++) % capacity, head_dim);
      decltype(hn::Zero(d)) acc[C][kQ];
      for (size_t b = 0; b < C; ++b) {
        for (size_t i = 0; i < count; ++i) acc[b][i] = hn::LoadU(d, outs[i] + c + b * N);
      }
      for (size_t j = jb; j < je; ++j) {
        decltype(hn::Zero(d)) vv[C];
        for (size_t b = 0; b < C; ++b) vv[b] = LoadKv<VT>(d, rows[j - jb], shift, c + b * N);
        for (size_t i = 0; i < count; ++i) {
          const auto s = hn::Set(d, scores[i * n + j]);
          for (size_t b = 0; b < C; ++b) acc[b][i] = hn::MulAdd(s, vv[b], acc[b][i]);
        }
      }
      for (size_t b = 0; b < C; ++b) {
        for (size_t i = 0; i < count; ++i) hn::StoreU(acc[b][i], d, outs[i] + c + b * N);
      }
    }
    for (; pf < pf_end; ++pf) Prefetch(v, (lo + pf) % capacity, head_dim);  // rows left over
    for (; c < head_dim; c += N) {
      decltype(hn::Zero(d)) acc[kQ];
      for (size_t i = 0; i < count; ++i) acc[i] = hn::LoadU(d, outs[i] + c);
      for (size_t j = jb; j < je; ++j) {
        const auto vv = LoadKv<VT>(d, rows[j - jb], shift, c);
        for (size_t i = 0; i < count; ++i) acc[i] = hn::MulAdd(hn::Set(d, scores[i * n + j]), vv, acc[i]);
      }
      for (size_t i = 0; i < count; ++i) hn::StoreU(acc[i], d, outs[i] + c);
    }
  }
}

// Heads or blocks narrower than a vector: one row at a time through kv_read_row, in scalar sums.
void ScoresScalar(const float* const* qs, size_t n_q, const KvHeadView& k, size_t capacity, size_t lo, size_t n,
                  size_t head_dim, float* scores) {
  float row[512];
  for (size_t j = 0; j < n; ++j) {
    const size_t slot = (lo + j) % capacity;
    kv_read_row(k.type, RowPtr(k, slot), k.scales ? k.scales + slot * k.scale_stride : nullptr, head_dim, k.block, row);
    for (size_t i = 0; i < n_q; ++i) {
      float s = 0.0f;
      for (size_t c = 0; c < head_dim; ++c) s += qs[i][c] * row[c];
      scores[i * n + j] = s;
    }
  }
}

void ValuesScalar(const float* scores, size_t n_q, const KvHeadView& v, size_t capacity, size_t lo, size_t n,
                  size_t head_dim, float* const* outs) {
  float row[512];
  for (size_t j = 0; j < n; ++j) {
    const size_t slot = (lo + j) % capacity;
    kv_read_row(v.type, RowPtr(v, slot), v.scales ? v.scales + slot * v.scale_stride : nullptr, head_dim, v.block, row);
    for (size_t i = 0; i < n_q; ++i) {
      for (size_t c = 0; c < head_dim; ++c) outs[i][c] += scores[i * n + j] * row[c];
    }
  }
}

template <class F>
void WithCount(size_t n_q, F&& f) {
  switch (n_q) {
    case 1: f(std::integral_constant<size_t, 1>{}); break;
    case 2: f(std::integral_constant<size_t, 2>{}); break;
    case 4: f(std::integral_constant<size_t, 4>{}); break;
    case 8: f(std::integral_constant<size_t, 8>{}); break;
    case 16: f(std::integral_constant<size_t, 16>{}); break;  // a prefill tile of 16 queries
    default: f(std::integral_constant<size_t, 0>{}); break;
  }
}

template <class F>
void WithType(KvType t, F&& f) {
  switch (t) {
    case KvType::kF16: f(std::integral_constant<KvType, KvType::kF16>{}); break;
    case KvType::kBF16: f(std::integral_constant<KvType, KvType::kBF16>{}); break;
    case KvType::kQ8: f(std::integral_constant<KvType, KvType::kQ8>{}); break;
  }
}

bool Vectorizable(const KvHeadView& view, size_t head_dim, size_t N) {
  return head_dim % N == 0 && head_dim <= 512 && (view.type != KvType::kQ8 || view.block % N == 0);
}

void AnyScores(const float* const* qs, size_t n_q, const KvHeadView& k, size_t capacity, size_t lo, size_t n,
               size_t head_dim, float* scores) {
  const hn::ScalableTag<float> d;
  if (!Vectorizable(k, head_dim, hn::Lanes(d))) return ScoresScalar(qs, n_q, k, capacity, lo, n, head_dim, scores);
  WithType(k.type, [&](auto kt) {
    WithCount(n_q, [&](auto nq) {
      Scores<decltype(kt)::value, decltype(nq)::value>(qs, n_q, k, capacity, lo, n, head_dim, scores);
    });
  });
}

void AnyValues(const float* scores, size_t n_q, const KvHeadView& v, size_t capacity, size_t lo, size_t n,
               size_t head_dim, float* const* outs) {
  const hn::ScalableTag<float> d;
  if (!Vectorizable(v, head_dim, hn::Lanes(d))) return ValuesScalar(scores, n_q, v, capacity, lo, n, head_dim, outs);
  WithType(v.type, [&](auto vt) {
    WithCount(n_q, [&](auto nq) {
      Values<decltype(vt)::value, decltype(nq)::value>(scores, n_q, v, capacity, lo, n, head_dim, outs);
    });
  });
}

// The group's unnormalized partial over [pos_begin, pos_end): out = sum_j exp(s_j - max) v_j.
void AttendGroupKv(const float* q, size_t group, const KvHeadView* k, const KvHeadView* v, size_t capacity,
                   size_t head_dim, size_t pos_begin, size_t pos_end, float* scores, float* out, float* max_out,
                   float* sum_out) {
  const size_t n = pos_end - pos_begin;
  const float* qs[kMaxBlockQueries];
  float* outs[kMaxBlockQueries];
  for (size_t h0 = 0; h0 < group; h0 += kMaxBlockQueries) {  // groups past 16 in pieces of 16
    const size_t m = std::min(kMaxBlockQueries, group - h0);
    for (size_t h = 0; h < m; ++h) qs[h] = q + (h0 + h) * head_dim, outs[h] = out + (h0 + h) * head_dim;
    AnyScores(qs, m, *k, capacity, pos_begin, n, head_dim, scores);
    for (size_t h = 0; h < m; ++h) sum_out[h0 + h] = exp_shifted(scores + h * n, n, &max_out[h0 + h]);
    for (size_t h = 0; h < m; ++h) std::fill_n(outs[h], head_dim, 0.0f);
    AnyValues(scores, m, *v, capacity, pos_begin, n, head_dim, outs);
  }
}

void AttendBlockKv(const float* const* qs, size_t n_q, const size_t* begins, const size_t* ends,
                   const KvHeadView* k, const KvHeadView* v, size_t capacity, size_t head_dim, float* scores,
                   float* const* outs) {
  size_t lo = begins[0], hi = ends[0];
  for (size_t i = 1; i < n_q; ++i) lo = std::min(lo, begins[i]), hi = std::max(hi, ends[i]);
  const size_t n = hi - lo;
  AnyScores(qs, n_q, *k, capacity, lo, n, head_dim, scores);
  float inv_sum[kMaxBlockQueries];
  for (size_t i = 0; i < n_q; ++i) {
    float* s = scores + i * n;
    float mx;
    const size_t b = begins[i] - lo, e = ends[i] - lo;
    inv_sum[i] = 1.0f / exp_shifted(s + b, e - b, &mx);
    std::fill(s, s + b, 0.0f);
    std::fill(s + e, s + n, 0.0f);
    std::fill_n(outs[i], head_dim, 0.0f);
  }
  AnyValues(scores, n_q, *v, capacity, lo, n, head_dim, outs);
  for (size_t i = 0; i < n_q; ++i) {
    for (size_t c = 0; c < head_dim; ++c) outs[i][c] *= inv_sum[i];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kestrel::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kestrel::kernels {

HWY_EXPORT(AttendGroupKv);
HWY_EXPORT(AttendBlockKv);

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::kF16: return "f16";
    case KvType::kBF16: return "bf16";
    case KvType::kQ8: return "q8";
  }
  return "?";
}

KvType parse_kv_type(const std::string& name, const std::string& option) {
  if (name == "f16" || name == "fp16") return KvType::kF16;
  if (name == "bf16") return KvType::kBF16;
  if (name == "q8" || name == "q8_0") return KvType::kQ8;
  throw Error(option + ": unknown KV cache type '" + name + "' (f16, bf16 or q8)");
}

size_t kv_q8_block(size_t head_dim) {
  size_t b = 32;
  while (b > 1 && head_dim % b != 0) b /= 2;
  return b;
}

size_t kv_row_bytes(KvType t, size_t elems, size_t block) {
  return t == KvType::kQ8 ? elems + 2 * (elems / block) : 2 * elems;
}

void kv_write_row(KvType t, const float* x, size_t n, size_t block, void* out, uint16_t* scales) {
  switch (t) {
    case KvType::kF16: to_fp16(x, static_cast<uint16_t*>(out), n); return;
    case KvType::kBF16: {
      auto* y = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) y[i] = gguf::fp32_to_bf16(x[i]);
      return;
    }
    case KvType::kQ8: {
      auto* y = static_cast<int8_t*>(out);
      for (size_t b0 = 0; b0 < n; b0 += block) {
        float amax = 0.0f;
        bool finite = true;
        for (size_t i = b0; i < b0 + block; ++i) {
          const float a = std::fabs(x[i]);
          finite = finite && std::isfinite(a);
          amax = std::max(amax, a);
        }
        if (!finite) amax = NAN;  // a NaN scale: the block reads back as NaN, as fp16 would
        const uint16_t d16 = gguf::fp32_to_fp16(amax / 127.0f);
        scales[b0 / block] = d16;
        const float d = gguf::fp16_to_fp32(d16);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (size_t i = b0; i < b0 + block; ++i) {
          // x / d with d rounded: |x| / d may pass 127 by the rounding of d; clamp it back.
          const float r = std::nearbyint(x[i] * id);
          y[i] = static_cast<int8_t>(std::isfinite(r) ? std::clamp(r, -127.0f, 127.0f) : 0.0f);
        }
      }
      return;
    }
  }
}

void kv_read_row(KvType t, const void* row, const uint16_t* scales, size_t n, size_t block, float* y) {
  switch (t) {
    case KvType::kF16: {
      const auto* h = static_cast<const uint16_t*>(row);
      for (size_t i = 0; i < n; ++i) y[i] = gguf::fp16_to_fp32(h[i]);
      return;
    }
    case KvType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(row);
      for (size_t i = 0; i < n; ++i) y[i] = gguf::bf16_to_fp32(h[i]);
      return;
    }
    case KvType::kQ8: {
      const auto* q = static_cast<const int8_t*>(row);
      for (size_t i = 0; i < n; ++i) y[i] = static_cast<float>(q[i]) * gguf::fp16_to_fp32(scales[i / block]);
      return;
    }
  }
}

void hadamard_rotate(float* x, size_t n) {
  if (n == 0 || (n & (n - 1)) != 0) throw Error("hadamard_rotate: " + std::to_string(n) + " is not a power of two");
  for (size_t h = 1; h < n; h *= 2) {
    for (size_t i = 0; i < n; i += 2 * h) {
      for (size_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float s = 1.0f / std::sqrt(static_cast<float>(n));
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}

namespace {
void check_views(const KvHeadView& k, const KvHeadView& v, size_t head_dim) {
  for (const KvHeadView* x : {&k, &v}) {
    if (head_dim > 512 || (x->type == KvType::kQ8 && (x->block == 0 || head_dim % x->block != 0 ||
                                                      (x->block & (x->block - 1)) != 0 ||
                                                      head_dim / x->block > 64))) {
      throw Error("attention over a typed KV cache: head_dim " + std::to_string(head_dim) +
                  " with q8 blocks of " + std::to_string(x->block) + " is not supported");
    }
  }
}
}  // namespace

void attend_partial_kv(const float* q, size_t group, const KvHeadView& k, const KvHeadView& v, size_t capacity,
                       size_t head_dim, size_t pos_begin, size_t pos_end, float* scores, float* out_unnormalized,
                       float* max_out, float* sum_out) {
  check_views(k, v, head_dim);
  HWY_DYNAMIC_DISPATCH(AttendGroupKv)(q, group, &k, &v, capacity, head_dim, pos_begin, pos_end, scores,
                                      out_unnormalized, max_out, sum_out);
}

void attend_group_kv(const float* q, size_t group, const KvHeadView& k, const KvHeadView& v, size_t capacity,
                     size_t head_dim, size_t pos_begin, size_t pos_end, float* scores, float* out) {
  float max_score[64], sum[64];
  if (group > 64) throw Error("attend_group_kv: more than 64 query heads per KV head");
  attend_partial_kv(q, group, k, v, capacity, head_dim, pos_begin, pos_end, scores, out, max_score, sum);
  for (size_t h = 0; h < group; ++h) scale_inplace(out + h * head_dim, 1.0f / sum[h], head_dim);
}

void attend_block_kv(const float* const* queries, size_t n_queries, const size_t* begins, const size_t* ends,
                     const KvHeadView& k, const KvHeadView& v, size_t capacity, size_t head_dim, float* scores,
                     float* const* outs) {
  if (n_queries == 0 || n_queries > kMaxBlockQueries) throw Error("attend_block_kv: 1 to 16 queries");
  check_views(k, v, head_dim);
  HWY_DYNAMIC_DISPATCH(AttendBlockKv)(queries, n_queries, begins, ends, &k, &v, capacity, head_dim, scores, outs);
}

}  // namespace kestrel::kernels
#endif  // HWY_ONCE
