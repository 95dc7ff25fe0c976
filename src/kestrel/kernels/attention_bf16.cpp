#include "kestrel/kernels/attention_bf16.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemm_bf16.h"
#include "kestrel/kernels/kernel_options.h"
#include "kestrel/kernels/ops.h"
#include "kestrel/kernels/x86_bf16.h"
#include "kestrel/kernels/x86_sums.h"

namespace kestrel::kernels {

namespace {
constexpr size_t kMaxHeadDim = 512;
}  // namespace

#ifdef KESTREL_HAVE_BF16_DOT
namespace {

// Bytes of V pairs that every quad of queries reads in turn: a block stays in L1 (32 KiB).
constexpr size_t kValueBlockBytes = 16384;

alignas(64) const uint16_t kZeroRow[kMaxHeadDim] = {};

// Element 2c of the result takes element c of the first 16, element 2c + 1 element c of the
// last 16: two rows' values side by side, the pairs vdpbf16ps multiplies.
alignas(64) const uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                              8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

struct Scratch {
  std::vector<uint16_t> q;        // [16][head_dim] the queries in bf16, padded to whole quads
  std::vector<float> scores;      // [16][width] from position `base` on
  std::vector<uint16_t> weights;  // [16][width] the softmax weights in bf16
  std::vector<float> dummy;       // outputs of the padding queries
};

KESTREL_BF16_TARGET inline __m512bh load_bh(const uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

KESTREL_BF16_TARGET inline __m512 load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// y = bf16(x), n a multiple of 32.
KESTREL_BF16_TARGET void f32_to_bf16(const float* x, uint16_t* y, size_t n) {
  for (size_t c = 0; c < n; c += 32) {
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + c + 16), _mm512_loadu_ps(x + c));
    _mm512_storeu_si512(y + c, reinterpret_cast<__m512i>(b));
  }
}

// y = bf16(fp16 h), n a multiple of 32 (fp16 -> float32 is exact).
KESTREL_BF16_TARGET void f16_to_bf16(const uint16_t* h, uint16_t* y, size_t n) {
  for (size_t c = 0; c < n; c += 32) {
    const __m512bh b = _mm512_cvtne2ps_pbh(load_f16(h + c + 16), load_f16(h + c));
    _mm512_storeu_si512(y + c, reinterpret_cast<__m512i>(b));
  }
}

// y[2c] = bf16(a[c]), y[2c + 1] = bf16(b[c]) for c < n (fp16 rows; n a multiple of 16).
KESTREL_BF16_TARGET void interleave_pair(const uint16_t* a, const uint16_t* b, uint16_t* y, size_t n) {
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (size_t c = 0; c < n; c += 16) {
    const __m512i ab = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(load_f16(b + c), load_f16(a + c)));
    _mm512_storeu_si512(y + 2 * c, _mm512_permutexvar_epi16(idx, ab));
  }
}

// Scores of NQ queries (bf16 rows) against NB blocks of 16 K rows (KvBf16's layout: per pair
// of elements, the 16 rows' pairs side by side), each block's piece loaded once for NQ
// products; rows[i] + 16 b receives query i's 16 scores of block b. Each score is its own lane:
// no horizontal sums.
template <size_t NB, size_t NQ>
KESTREL_BF16_TARGET void scores_blocks(const uint16_t* kb, const uint16_t* const* q, size_t hd, float* const* rows) {
  __m512 acc[NQ][NB];
  for (auto& row : acc) for (auto& a : row) a = _mm512_setzero_ps();
  const size_t block = 16 * hd;
  for (size_t c2 = 0; c2 < hd / 2; ++c2) {
    __m512bh kv[NB];
    for (size_t b = 0; b < NB; ++b) kv[b] = load_bh(kb + b * block + 32 * c2);
    for (size_t i = 0; i < NQ; ++i) {
      int32_t pair;
      std::memcpy(&pair, q[i] + 2 * c2, sizeof pair);
      const __m512bh qv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      for (size_t b = 0; b < NB; ++b) acc[i][b] = _mm512_dpbf16_ps(acc[i][b], kv[b], qv);
    }
  }
  for (size_t i = 0; i < NQ; ++i) {
    for (size_t b = 0; b < NB; ++b) _mm512_storeu_ps(rows[i] + 16 * b, acc[i][b]);
  }
}

// outs[i][c0 .. c0 + 16 NC) += sum over pairs m < n_pairs of w_i(m) . v(m), for 4 queries: vp
// holds the pairs (2 head_dim bf16 each), w[i] the query's weights as bf16 pairs.
template <size_t NC>
KESTREL_BF16_TARGET void values_quad(const uint16_t* vp, size_t n_pairs, size_t hd, size_t c0,
                                     const uint16_t* const* w, float* const* outs) {
  __m512 acc[4][NC];
  for (size_t i = 0; i < 4; ++i) {
    for (size_t c = 0; c < NC; ++c) acc[i][c] = _mm512_loadu_ps(outs[i] + c0 + 16 * c);
  }
  for (size_t m = 0; m < n_pairs; ++m) {
    __m512bh vv[NC];
    for (size_t c = 0; c < NC; ++c) vv[c] = load_bh(vp + m * 2 * hd + 2 * (c0 + 16 * c));
    for (size_t i = 0; i < 4; ++i) {
      int32_t pair;
      std::memcpy(&pair, w[i] + 2 * m, sizeof pair);
      const __m512bh wv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      for (size_t c = 0; c < NC; ++c) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], vv[c], wv);
    }
  }
  for (size_t i = 0; i < 4; ++i) {
    for (size_t c = 0; c < NC; ++c) _mm512_storeu_ps(outs[i] + c0 + 16 * c, acc[i][c]);
  }
}

KESTREL_BF16_TARGET void scale(float* y, float s, size_t n) {
  const __m512 sv = _mm512_set1_ps(s);
  for (size_t c = 0; c < n; c += 16) _mm512_storeu_ps(y + c, _mm512_mul_ps(_mm512_loadu_ps(y + c), sv));
}

void convert(const uint16_t* k, const uint16_t* v, size_t stride, size_t capacity, size_t hd, size_t first,
             size_t valid_end, size_t p0, size_t p1, uint16_t* k_out, uint16_t* v_out) {
  const auto row = [&](const uint16_t* cache, size_t pos) {
    return pos < valid_end ? cache + (pos % capacity) * stride : kZeroRow;
  };
  alignas(64) uint16_t rows[16 * kMaxHeadDim];
  for (size_t p = p0; p < p1; p += 16) {
    for (size_t r = 0; r < 16; ++r) f16_to_bf16(row(k, p + r), rows + r * hd, hd);
    uint16_t* block = k_out + (p - first) * hd;
    for (size_t c2 = 0; c2 < hd / 2; ++c2) {
      for (size_t r = 0; r < 16; ++r) std::memcpy(block + 32 * c2 + 2 * r, rows + r * hd + 2 * c2, 4);
    }
    for (size_t r = 0; r < 16; r += 2) {
      interleave_pair(row(v, p + r), row(v, p + r + 1), v_out + (p + r - first) * hd, hd);
    }
  }
}

alignas(64) const float kZeroRowF32[kMaxHeadDim] = {};

// y[0..hd) = the row of `view` at `slot` as float32 (exact), hd a multiple of 16.
KESTREL_BF16_TARGET void row_to_f32(const KvHeadView& view, size_t slot, size_t hd, float* y) {
  switch (view.type) {
    case KvType::kF16: {
      const auto* h = static_cast<const uint16_t*>(view.data) + slot * view.stride;
      for (size_t c = 0; c < hd; c += 16) _mm512_storeu_ps(y + c, load_f16(h + c));
      return;
    }
    case KvType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(view.data) + slot * view.stride;
      for (size_t c = 0; c < hd; c += 16) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + c)));
        _mm512_storeu_ps(y + c, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
      }
      return;
    }
    case KvType::kQ8: {
      const auto* q = static_cast<const int8_t*>(view.data) + slot * view.stride;
      const uint16_t* sc = view.scales + slot * view.scale_stride;
      if (view.block % 16 != 0) {
        kv_read_row(view.type, q, sc, hd, view.block, y);
        return;
      }
      for (size_t c = 0; c < hd; c += 16) {
        const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c))));
        _mm512_storeu_ps(y + c, _mm512_mul_ps(x, _mm512_set1_ps(gguf::fp16_to_fp32(sc[c / view.block]))));
      }
      return;
    }
  }
}

// y[2c] = bf16(a[c]), y[2c + 1] = bf16(b[c]) for c < n (float32 rows; n a multiple of 16).
KESTREL_BF16_TARGET void interleave_pair_f32(const float* a, const float* b, uint16_t* y, size_t n) {
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (size_t c = 0; c < n; c += 16) {
    const __m512i ab = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(b + c), _mm512_loadu_ps(a + c)));
    _mm512_storeu_si512(y + 2 * c, _mm512_permutexvar_epi16(idx, ab));
  }
}

void convert_typed(const KvHeadView& k, const KvHeadView& v, size_t capacity, size_t hd, size_t first,
                   size_t valid_end, size_t p0, size_t p1, uint16_t* k_out, uint16_t* v_out) {
  alignas(64) float a[kMaxHeadDim], b[kMaxHeadDim];
  alignas(64) uint16_t rows[16 * kMaxHeadDim];
  const auto row = [&](const KvHeadView& view, size_t pos, float* y) -> const float* {
    if (pos >= valid_end) return kZeroRowF32;
    row_to_f32(view, pos % capacity, hd, y);
    return y;
  };
  for (size_t p = p0; p < p1; p += 16) {
    for (size_t r = 0; r < 16; ++r) f32_to_bf16(row(k, p + r, a), rows + r * hd, hd);
    uint16_t* block = k_out + (p - first) * hd;
    for (size_t c2 = 0; c2 < hd / 2; ++c2) {
      for (size_t r = 0; r < 16; ++r) std::memcpy(block + 32 * c2 + 2 * r, rows + r * hd + 2 * c2, 4);
    }
    for (size_t r = 0; r < 16; r += 2) {
      interleave_pair_f32(row(v, p + r, a), row(v, p + r + 1, b), v_out + (p + r - first) * hd, hd);
    }
  }
}

void attend(const float* const* queries, size_t n_q, const size_t* begins, const size_t* ends, const KvBf16& kv,
            size_t hd, float* const* outs) {
  thread_local Scratch s;
  size_t lo = begins[0], hi = ends[0];
  for (size_t i = 1; i < n_q; ++i) lo = std::min(lo, begins[i]), hi = std::max(hi, ends[i]);
  // Column 0 of the scores and weights is position `base`, the first of the K block holding lo
  // (so even: the pairs of V rows are the cache's pairs in every tile).
  const size_t base = kv.first + (lo - kv.first) / 16 * 16;
  const size_t n_rows = hi - base, width = (n_rows + 31) / 32 * 32;
  const size_t n_padded = (n_q + 3) / 4 * 4;
  s.q.resize(n_padded * hd);
  s.scores.resize(n_padded * width);
  s.weights.resize(n_padded * width);
  for (size_t i = 0; i < n_padded; ++i) {
    if (i < n_q) {
      f32_to_bf16(queries[i], &s.q[i * hd], hd);
    } else {
      std::fill_n(&s.q[i * hd], hd, uint16_t{0});
    }
  }
  const uint16_t* qr[kMaxBlockQueries];
  for (size_t i = 0; i < n_padded; ++i) qr[i] = &s.q[i * hd];
  const size_t n_blocks = (n_rows + 15) / 16;
  const uint16_t* kb = kv.k + (base - kv.first) * hd;
  for (size_t q0 = 0; q0 < n_padded; q0 += 8) {
    const bool eight = q0 + 8 <= n_padded;
    float* rows[8];
    for (size_t i = 0; i < (eight ? 8 : 4); ++i) rows[i] = &s.scores[(q0 + i) * width];
    size_t b = 0;
    for (; b + 2 <= n_blocks; b += 2) {
      if (eight) {
        scores_blocks<2, 8>(kb + b * 16 * hd, qr + q0, hd, rows);
      } else {
        scores_blocks<2, 4>(kb + b * 16 * hd, qr + q0, hd, rows);
      }
      for (auto& r : rows) r += 32;
    }
    if (b < n_blocks) {
      if (eight) {
        scores_blocks<1, 8>(kb + b * 16 * hd, qr + q0, hd, rows);
      } else {
        scores_blocks<1, 4>(kb + b * 16 * hd, qr + q0, hd, rows);
      }
    }
  }
  // Softmax over each query's own range; zero weights elsewhere (padding queries: all zero).
  float inv_sum[kMaxBlockQueries];
  float* quad_outs[kMaxBlockQueries];
  s.dummy.resize(3 * hd);
  for (size_t i = 0; i < n_padded; ++i) {
    float* sc = &s.scores[i * width];
    if (i < n_q) {
      const size_t b = begins[i] - base, e = ends[i] - base;
      float mx;
      inv_sum[i] = 1.0f / exp_shifted(sc + b, e - b, &mx);
      std::fill(sc, sc + b, 0.0f);
      std::fill(sc + e, sc + width, 0.0f);
      quad_outs[i] = outs[i];
    } else {
      std::fill(sc, sc + width, 0.0f);
      quad_outs[i] = &s.dummy[(i - n_q) * hd];
    }
    std::fill_n(quad_outs[i], hd, 0.0f);
    f32_to_bf16(sc, &s.weights[i * width], width);
  }
  // Values: blocks of pairs read by every quad of queries in turn, in position order.
  const size_t n_pairs = std::min(n_rows + 1, kv.end - base) / 2;
  const size_t block = std::max<size_t>(1, kValueBlockBytes / (4 * hd));
  for (size_t m0 = 0; m0 < n_pairs; m0 += block) {
    const size_t np = std::min(block, n_pairs - m0);
    const uint16_t* vp = kv.v + (base + 2 * m0 - kv.first) * hd;
    for (size_t q0 = 0; q0 < n_padded; q0 += 4) {
      const uint16_t* w[4];
      for (size_t i = 0; i < 4; ++i) w[i] = &s.weights[(q0 + i) * width + 2 * m0];
      size_t c0 = 0;
      for (; c0 + 64 <= hd; c0 += 64) values_quad<4>(vp, np, hd, c0, w, quad_outs + q0);
      if (c0 < hd) values_quad<2>(vp, np, hd, c0, w, quad_outs + q0);
    }
  }
  for (size_t i = 0; i < n_q; ++i) scale(outs[i], inv_sum[i], hd);
}

}  // namespace
#endif  // KESTREL_HAVE_BF16_DOT

bool bf16_attention_available(size_t head_dim) {
  return kernel_options().bf16_attention && bf16_dot_available() && head_dim % 32 == 0 && head_dim <= kMaxHeadDim;
}

void kv_to_bf16(const uint16_t* k, const uint16_t* v, size_t stride, size_t capacity, size_t head_dim,
                size_t first, size_t valid_end, size_t p0, size_t p1, uint16_t* k_out, uint16_t* v_out) {
#ifdef KESTREL_HAVE_BF16_DOT
  convert(k, v, stride, capacity, head_dim, first, valid_end, p0, p1, k_out, v_out);
#else
  (void)k, (void)v, (void)stride, (void)capacity, (void)head_dim, (void)first, (void)valid_end, (void)p0,
      (void)p1, (void)k_out, (void)v_out;
#endif
}

void kv_to_bf16(const KvHeadView& k, const KvHeadView& v, size_t capacity, size_t head_dim, size_t first,
                size_t valid_end, size_t p0, size_t p1, uint16_t* k_out, uint16_t* v_out) {
#ifdef KESTREL_HAVE_BF16_DOT
  if (k.type == KvType::kF16 && v.type == KvType::kF16) {
    convert(static_cast<const uint16_t*>(k.data), static_cast<const uint16_t*>(v.data), k.stride, capacity, head_dim,
            first, valid_end, p0, p1, k_out, v_out);
    return;
  }
  convert_typed(k, v, capacity, head_dim, first, valid_end, p0, p1, k_out, v_out);
#else
  (void)k, (void)v, (void)capacity, (void)head_dim, (void)first, (void)valid_end, (void)p0, (void)p1, (void)k_out,
      (void)v_out;
#endif
}

void attend_block_bf16(const float* const* queries, size_t n_queries, const size_t* begins,
                       const size_t* ends, const KvBf16& kv, size_t head_dim, float* const* outs) {
#ifdef KESTREL_HAVE_BF16_DOT
  attend(queries, n_queries, begins, ends, kv, head_dim, outs);
#else
  (void)queries, (void)n_queries, (void)begins, (void)ends, (void)kv, (void)head_dim, (void)outs;
#endif
}

}  // namespace kestrel::kernels
