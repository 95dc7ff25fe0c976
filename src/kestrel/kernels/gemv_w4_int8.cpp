#include "kestrel/kernels/gemv_w4_int8.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemm_w8a8.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/int8_isa.h"
#include "kestrel/kernels/int8_super_activations.h"
#include "kestrel/kernels/kernel_options.h"
#include "kestrel/kernels/x86_int8_targets.h"
#include "kestrel/quant/w4.h"

namespace kestrel::kernels {
namespace {

constexpr size_t kBlock = 16;          // rows per interleaved block
constexpr size_t kXBlock = 32;         // columns per activation block
constexpr size_t kMaxTileTokens = 4;   // tokens per pass over a block of rows (AVX2 under 8, portable)
// AVX512-VNNI: 8 tokens a pass share each unpacked code vector and group parameter (twice as
// many vpdpbusd per vpand / shift / scale conversion as 4); the same bits, per token, as 4.
constexpr size_t kMaxTileTokensVnni = 8;
constexpr size_t kPrefetchBytes = 1024;         // codes requested this far ahead
constexpr size_t kPrefetchParams = 8 * kBlock;  // group parameters requested 8 groups ahead

// Byte of an octet's 64 bytes holding row i's column 8o + e, and whether in the high nibble.
size_t code_byte(size_t i, size_t e) { return 4 * i + e % 4; }

// The activations of one call: int8 values, and per token and block d_xb and float(S_b) * d_xb.
struct Activations {
  Q8Activations q;
  std::vector<float> sx;  // [n_tokens][cols / 32]
};

// The sums' float32 products float(S_b) * d_xb.
void finish(Activations& a) {
  a.sx.resize(a.q.sum128.size());
  for (size_t j = 0; j < a.sx.size(); ++j) a.sx[j] = static_cast<float>(a.q.sum128[j] / 128) * a.q.scale[j];
}

// The portable quantization (quantize_q8_activations).
void quantize(const float* x, size_t n_tokens, size_t x_stride, size_t cols, Activations& a) {
  quantize_q8_activations(x, n_tokens, x_stride, cols, a.q);
  finish(a);
}

// Tokens t0 .. t0 + NT of a call's activations: their int8 values, d_xb and float(S_b) * d_xb.
template <size_t NT>
struct TokenRows {
  const int8_t* q[NT];
  const float* d[NT];
  const float* sx[NT];
  TokenRows(const Activations& a, size_t t0, size_t cols) {
    const size_t nb = cols / kXBlock;
    for (size_t t = 0; t < NT; ++t) {
      q[t] = &a.q.q[(t0 + t) * cols];
      d[t] = &a.q.scale[(t0 + t) * nb];
      sx[t] = &a.sx[(t0 + t) * nb];
    }
  }
};

// `q` sized for n_tokens x cols (reused without allocating once large enough), for the SIMD
// quantizers to fill.
[[maybe_unused]] Q8Activations& sized(Q8Activations& q, size_t n_tokens, size_t cols) {
  q.n_tokens = n_tokens;
  q.cols = cols;
  q.q.resize(n_tokens * cols);
  q.scale.resize(n_tokens * (cols / kXBlock));
  q.sum128.resize(n_tokens * (cols / kXBlock));
  return q;
}

void check(const W4Int8Interleaved& il, size_t row_begin, size_t row_end) {
  if (row_end > il.rows || row_begin > row_end) throw Error("gemv_w4_int8: rows past the matrix");
}

// ---- 8-bit group parameters: activations per 128-column superblock, integer group scales ----
// (gemv_w4_int8.h, "Superblocks").

bool superblocks(const W4Int8Interleaved& il) {
  return il.params8() && il.cols % kSuper == 0 && kSuper % il.group_size == 0;
}

void size_super(SuperActivations& a, size_t n_tokens, size_t cols, size_t G) {
  a.q.resize(n_tokens * cols);
  a.dx.resize(n_tokens * (cols / kSuper));
  a.sums.assign(n_tokens * (cols / G) + 1, 0);
}

// The group sums S_g of token t's int8 values (exact integers: the same on every path).
void group_sums(SuperActivations& a, size_t t, size_t cols, size_t G) {
  const int8_t* q = &a.q[t * cols];
  for (size_t g = 0; g < cols / G; ++g) {
    int32_t s = 0;
    for (size_t i = 0; i < G; ++i) s += q[g * G + i];
    a.sums[t * (cols / G) + g] = static_cast<int16_t>(s);
  }
}

// The portable quantization: per superblock dx = max|x| / 127, q = round-to-nearest-even(x / dx)
// clamped to [-127, 127] (0 where dx = 0).
void quantize_super(const float* x, size_t n_tokens, size_t x_stride, size_t cols, size_t G, SuperActivations& a) {
  size_super(a, n_tokens, cols, G);
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t k = 0; k < cols / kSuper; ++k) {
      const float* v = x + t * x_stride + k * kSuper;
      float amax = 0.0f;
      for (size_t i = 0; i < kSuper; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float d = amax / 127.0f;
      int8_t* out = &a.q[t * cols + k * kSuper];
      for (size_t i = 0; i < kSuper; ++i) {
        out[i] = d > 0.0f ? static_cast<int8_t>(std::clamp(std::nearbyint(v[i] / d), -127.0f, 127.0f)) : 0;
      }
      a.dx[t * (cols / kSuper) + k] = d;
    }
    group_sums(a, t, cols, G);
  }
}

// The portable path: per row and token, per superblock k in order (integers exact),
//   T1 = sum_g s_g * D_g  (symmetric: s_g * (D_g - 8 S_g)),  T2 = sum_g n_g * S_g,
//   acc1 = fma(float(T1), dx_k, acc1),  acc2 = fma(float(T2), dx_k, acc2),
// then y = fma(d_row, acc1, -(m_row * acc2)) (symmetric: d_row * acc1).
void scalar_super(const W4Int8Interleaved& il, const SuperActivations& a, size_t n_tokens, float* y, size_t y_stride,
                  size_t row_begin, size_t row_end) {
  const size_t G = il.group_size, n_groups = il.cols / G, octets = il.cols / 8, gps = kSuper / G;
  const bool affine = !il.mins8.empty();
  for (size_t r = row_begin; r < row_end; ++r) {
    const size_t block = r / kBlock, i = r % kBlock;
    const uint8_t* codes = &il.codes[block * octets * 64];
    for (size_t t = 0; t < n_tokens; ++t) {
      const int8_t* xq = &a.q[t * il.cols];
      const int16_t* sg = &a.sums[t * n_groups];
      float acc1 = 0.0f, acc2 = 0.0f;
      for (size_t k = 0; k < il.cols / kSuper; ++k) {
        int32_t t1 = 0, t2 = 0;
        for (size_t g = k * gps; g < (k + 1) * gps; ++g) {
          const size_t at = (block * n_groups + g) * kBlock + i;
          int32_t dot = 0;
          for (size_t c = g * G; c < (g + 1) * G; ++c) {
            const uint8_t byte = codes[(c / 8) * 64 + code_byte(i, c % 8)];
            dot += (c % 8 < 4 ? byte & 0x0F : byte >> 4) * xq[c];
          }
          if (affine) {
            t1 += static_cast<int32_t>(il.scales8[at]) * dot;
            t2 += static_cast<int32_t>(il.mins8[at]) * sg[g];
          } else {
            t1 += static_cast<int32_t>(il.scales8[at]) * (dot - 8 * sg[g]);
          }
        }
        const float dx = a.dx[t * (il.cols / kSuper) + k];
        acc1 = std::fma(static_cast<float>(t1), dx, acc1);
        acc2 = std::fma(static_cast<float>(t2), dx, acc2);
      }
      y[t * y_stride + r] = affine ? std::fma(il.row_d[r], acc1, -(il.row_m[r] * acc2)) : il.row_d[r] * acc1;
    }
  }
}

#ifdef KESTREL_HAVE_VNNI

KESTREL_VNNI_TARGET inline __m512 u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Four int8 values as one 32-bit lane broadcast to all 16.
KESTREL_VNNI_TARGET inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// Block `block`'s 16 rows for NT tokens (1..8) starting at token t0 into out[t][0..16).
template <size_t NT, bool kParams8>
KESTREL_VNNI_TARGET void block16(const W4Int8Interleaved& il, size_t block, const Activations& a, size_t t0,
                                 float (*out)[kBlock]) {
  const size_t G = il.group_size, n_groups = il.cols / G, octets = il.cols / 8;
  const size_t blocks_per_group = G / kXBlock;
  // Independent integer chains per token: 2 (low / high nibbles), 4 with few tokens (also by
  // octet parity) to hide vpdpbusd's latency, 1 with 5-8 tokens (their chains are enough, and
  // the registers are not: 8 tokens' sums, zero-point sums and chains take 24 of 32). Integer
  // sums are exact in any order.
  constexpr size_t kChains = NT <= 2 ? 4 : NT <= 4 ? 2 : 1;
  const __m512i low = _mm512_set1_epi8(0x0F);
  const uint8_t* codes = &il.codes[block * octets * 64];
  const TokenRows<NT> rows(a, t0, il.cols);
  const auto& xq = rows.q;
  const auto& xd = rows.d;
  const auto& xs = rows.sx;
  __m512 acc[NT], macc[NT];
  for (size_t t = 0; t < NT; ++t) acc[t] = macc[t] = _mm512_setzero_ps();
  __m512 row_d = _mm512_setzero_ps(), neg_row_m = _mm512_setzero_ps();
  if constexpr (kParams8) {
    row_d = _mm512_loadu_ps(&il.row_d[block * kBlock]);
    neg_row_m = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_loadu_ps(&il.row_m[block * kBlock])),
                                                     _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  }
  for (size_t g = 0; g < n_groups; ++g) {
    const size_t at = (block * n_groups + g) * kBlock;
    __m512 d, m;
    if constexpr (kParams8) {
      d = _mm512_mul_ps(row_d, u8(&il.scales8[at]));
      m = il.mins8.empty() ? _mm512_mul_ps(d, _mm512_set1_ps(-8.0f)) : _mm512_mul_ps(neg_row_m, u8(&il.mins8[at]));
    } else {
      _mm_prefetch(reinterpret_cast<const char*>(il.scales.data() + at + kPrefetchParams), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(il.mins.data() + at + kPrefetchParams), _MM_HINT_T0);
      d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&il.scales[at])));
      m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&il.mins[at])));
    }
    for (size_t k = 0; k < blocks_per_group; ++k) {
      const size_t b = g * blocks_per_group + k;
      __m512i dot[NT][kChains];
      for (size_t t = 0; t < NT; ++t) {
        for (size_t c = 0; c < kChains; ++c) dot[t][c] = _mm512_setzero_si512();
      }
      for (size_t oi = 0; oi < kXBlock / 8; ++oi) {
        const size_t o = b * (kXBlock / 8) + oi;
        // A prefetch past the end does not fault.
        _mm_prefetch(reinterpret_cast<const char*>(codes + 64 * o + kPrefetchBytes), _MM_HINT_T0);
        const __m512i bytes = _mm512_loadu_si512(codes + 64 * o);
        const __m512i lo = _mm512_and_si512(bytes, low), hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low);
        const size_t c0 = kChains == 4 ? 2 * (oi & 1) : 0, c1 = kChains == 1 ? 0 : c0 + 1;
        for (size_t t = 0; t < NT; ++t) {
          // Activations 8o .. 8o + 3 and 8o + 4 .. 8o + 7, each broadcast straight from memory
          // (vpdpbusd's {1to16} operand, a load port): one 8-byte load split in registers
          // would broadcast from a general register on the port that also runs vpdpbusd.
          dot[t][c0] = _mm512_dpbusd_epi32(dot[t][c0], lo, broadcast4(xq[t] + 8 * o));
          dot[t][c1] = _mm512_dpbusd_epi32(dot[t][c1], hi, broadcast4(xq[t] + 8 * o + 4));
        }
      }
      for (size_t t = 0; t < NT; ++t) {
        __m512i sum = dot[t][0];
        if constexpr (kChains >= 2) sum = _mm512_add_epi32(sum, dot[t][1]);
        if constexpr (kChains == 4) sum = _mm512_add_epi32(sum, _mm512_add_epi32(dot[t][2], dot[t][3]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(xd[t][b])), acc[t]);
        macc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[t][b]), macc[t]);
      }
    }
  }
  for (size_t t = 0; t < NT; ++t) _mm512_storeu_ps(out[t], _mm512_add_ps(acc[t], macc[t]));
}

// quantize() with AVX-512, the same numbers: max|x| is exact in any order, x / d an IEEE
// division, and the rounding to nearest even that nearbyint does in the default rounding mode.
KESTREL_VNNI_TARGET void quantize_avx512(const float* x, size_t n_tokens, size_t x_stride, size_t cols,
                                         Activations& a) {
  const size_t nb = cols / kXBlock;
  Q8Activations& q = sized(a.q, n_tokens, cols);
  const __m512 limit = _mm512_set1_ps(127.0f), neg_limit = _mm512_set1_ps(-127.0f);
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t b = 0; b < nb; ++b) {
      const float* v = x + t * x_stride + b * kXBlock;
      const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float d = amax / 127.0f;
      int8_t* out = &q.q[t * cols + b * kXBlock];
      int32_t sum = 0;
      if (d > 0.0f) {
        const __m512 dv = _mm512_set1_ps(d);
        constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        const __m512 r0 = _mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_div_ps(v0, dv), kNearest), neg_limit), limit);
        const __m512 r1 = _mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_div_ps(v1, dv), kNearest), neg_limit), limit);
        const __m512i i0 = _mm512_cvtps_epi32(r0), i1 = _mm512_cvtps_epi32(r1);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(i1));
        sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
      } else {
        std::memset(out, 0, kXBlock);
      }
      q.scale[t * nb + b] = d;
      q.sum128[t * nb + b] = 128 * sum;
    }
  }
  finish(a);
}

void block_tokens(const W4Int8Interleaved& il, size_t block, const Activations& a, size_t t0, size_t n,
                  float (*out)[kBlock]) {
  if (il.params8()) {
    switch (n) {
      case 8: return block16<8, true>(il, block, a, t0, out);
      case 7: return block16<7, true>(il, block, a, t0, out);
      case 6: return block16<6, true>(il, block, a, t0, out);
      case 5: return block16<5, true>(il, block, a, t0, out);
      case 4: return block16<4, true>(il, block, a, t0, out);
      case 3: return block16<3, true>(il, block, a, t0, out);
      case 2: return block16<2, true>(il, block, a, t0, out);
      default: return block16<1, true>(il, block, a, t0, out);
    }
  }
  switch (n) {
    case 8: return block16<8, false>(il, block, a, t0, out);
    case 7: return block16<7, false>(il, block, a, t0, out);
    case 6: return block16<6, false>(il, block, a, t0, out);
    case 5: return block16<5, false>(il, block, a, t0, out);
    case 4: return block16<4, false>(il, block, a, t0, out);
    case 3: return block16<3, false>(il, block, a, t0, out);
    case 2: return block16<2, false>(il, block, a, t0, out);
    default: return block16<1, false>(il, block, a, t0, out);
  }
}

// quantize() with AVX2, the same numbers (as quantize_avx512: max|x| is exact in any order, an
// IEEE division, rounding to nearest even).
KESTREL_AVX2_TARGET void quantize_avx2(const float* x, size_t n_tokens, size_t x_stride, size_t cols,
                                       Activations& a) {
  const size_t nb = cols / kXBlock;
  Q8Activations& q = sized(a.q, n_tokens, cols);
  const __m256 sign = _mm256_set1_ps(-0.0f), limit = _mm256_set1_ps(127.0f), neg_limit = _mm256_set1_ps(-127.0f);
  // packs_epi32 then packs_epi16 interleave 128-bit lanes: this puts the 32 bytes back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t b = 0; b < nb; ++b) {
      const float* v = x + t * x_stride + b * kXBlock;
      __m256 vs[4];
      for (size_t k = 0; k < 4; ++k) vs[k] = _mm256_loadu_ps(v + 8 * k);
      __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, vs[0]), _mm256_andnot_ps(sign, vs[1])),
                               _mm256_max_ps(_mm256_andnot_ps(sign, vs[2]), _mm256_andnot_ps(sign, vs[3])));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
      const float d = _mm_cvtss_f32(m4) / 127.0f;
      int8_t* out = &q.q[t * cols + b * kXBlock];
      int32_t sum = 0;
      if (d > 0.0f) {
        const __m256 dv = _mm256_set1_ps(d);
        __m256i i[4];
        for (size_t k = 0; k < 4; ++k) {
          const __m256 r = _mm256_round_ps(_mm256_div_ps(vs[k], dv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          i[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, neg_limit), limit));
        }
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutevar8x32_epi32(bytes, order));
        const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        sum = _mm_cvtsi128_si32(s4);
      } else {
        std::memset(out, 0, kXBlock);
      }
      q.scale[t * nb + b] = d;
      q.sum128[t * nb + b] = 128 * sum;
    }
  }
  finish(a);
}

// Eight unsigned bytes as float32.
KESTREL_AVX2_TARGET inline __m256 u8x8_avx2(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Four int8 values as one 32-bit lane broadcast to all 8, loaded by the broadcast itself
// (vpbroadcastd ymm, m32). A memcpy into an int32 and set1 let GCC load 8 bytes once and split
// them in general registers (vmovd + vpbroadcastd from a register, on the vector ports that also
// run vpmaddubsw): 4 tokens ran at ~40 % of vpmaddubsw's rate that way.
KESTREL_AVX2_TARGET inline __m256i broadcast4_avx2(const int8_t* p) {
  return _mm256_broadcastd_epi32(_mm_loadu_si32(p));
}

// The group parameters of the 8 rows of half `h` of block `block` as float32 vectors: d and m
// of group g, computed as the header says (fp16 widened, or 8-bit codes times the row's d_row,
// m_row).
template <bool kParams8>
struct GroupParams8 {
  const W4Int8Interleaved& il;
  size_t block, h;
  __m256 row_d = _mm256_setzero_ps(), neg_row_m = _mm256_setzero_ps();
  KESTREL_AVX2_TARGET GroupParams8(const W4Int8Interleaved& w, size_t blk, size_t half) : il(w), block(blk), h(half) {
    if constexpr (kParams8) {
      row_d = _mm256_loadu_ps(&il.row_d[block * kBlock + 8 * h]);
      neg_row_m = _mm256_xor_ps(_mm256_loadu_ps(&il.row_m[block * kBlock + 8 * h]), _mm256_set1_ps(-0.0f));
    }
  }
  KESTREL_AVX2_TARGET void at(size_t g, __m256& d, __m256& m) const {
    const size_t at = (block * (il.cols / il.group_size) + g) * kBlock + 8 * h;
    if constexpr (kParams8) {
      d = _mm256_mul_ps(row_d, u8x8_avx2(&il.scales8[at]));
      m = il.mins8.empty() ? _mm256_mul_ps(d, _mm256_set1_ps(-8.0f)) : _mm256_mul_ps(neg_row_m, u8x8_avx2(&il.mins8[at]));
    } else {
      d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(&il.scales[at])));
      m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(&il.mins[at])));
    }
  }
};

// Where token t's four int8 activations for octet o's low (hi false) or high nibbles lie: in the
// token's own row (Activations, TokenRows) or side by side with 7 other tokens' (Tokens8).
struct TokenRowsX {
  const int8_t* const* q;
  const int8_t* operator()(size_t t, size_t o, bool hi) const { return q[t] + 8 * o + (hi ? 4 : 0); }
};
struct SideBySideX {
  const int8_t* q;
  const int8_t* operator()(size_t t, size_t o, bool hi) const { return q + 64 * o + (hi ? 32 : 0) + 4 * t; }
};

// dot[t] = the int16 pair sums of block b's 32 columns for 8 rows (codes: their half of each
// octet) and NT tokens: vpmaddubsw of the unsigned codes against the broadcast activations,
// 16 products of at most 15 * 127 per int16 (|sum| <= 30,480 < 2^15: exact).
template <size_t NT, class X>
KESTREL_AVX2_TARGET inline void block_dots(const uint8_t* codes, size_t b, const X& x, __m256i (&dot)[NT]) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (size_t t = 0; t < NT; ++t) dot[t] = _mm256_setzero_si256();
  // Not unrolled: GCC then computes all 32 products of a block before adding them and spills
  // them to the stack.
#pragma GCC unroll 1
  for (size_t oi = 0; oi < kXBlock / 8; ++oi) {
    const size_t o = b * (kXBlock / 8) + oi;
    _mm_prefetch(reinterpret_cast<const char*>(codes + 64 * o + kPrefetchBytes), _MM_HINT_T0);
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * o));
    const __m256i lo = _mm256_and_si256(bytes, low), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
    for (size_t t = 0; t < NT; ++t) {
      dot[t] = _mm256_add_epi16(dot[t], _mm256_maddubs_epi16(lo, broadcast4_avx2(x(t, o, false))));
      dot[t] = _mm256_add_epi16(dot[t], _mm256_maddubs_epi16(hi, broadcast4_avx2(x(t, o, true))));
    }
  }
}

// AVX2: the 8 rows of half `h` (0: rows 0-7, 1: rows 8-15; the first or second 32 bytes of
// each octet's 64) of block `block`, for NT tokens (1..4) starting at t0, into
// out[t][8h .. 8h + 8). vpmaddubsw multiplies the unsigned codes (0..15) by the int8
// activations and sums each pair to int16; a 32-column block adds 8 such results per int16
// (16 products of at most 15 * 127: |sum| <= 30,480 < 2^15, exact, no saturation), then
// vpmaddwd by ones adds a lane's two int16 into row i's int32 dot product: the same integer as
// vpdpbusd's, followed by the same float32 operations as block16 above.
template <size_t NT, bool kParams8>
KESTREL_AVX2_TARGET void block8_avx2(const W4Int8Interleaved& il, size_t block, size_t h, const Activations& a,
                                     size_t t0, float (*out)[kBlock]) {
  const size_t G = il.group_size, n_groups = il.cols / G, octets = il.cols / 8;
  const size_t blocks_per_group = G / kXBlock;
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* codes = &il.codes[block * octets * 64 + 32 * h];
  const TokenRows<NT> rows(a, t0, il.cols);
  const auto& xq = rows.q;
  const auto& xd = rows.d;
  const auto& xs = rows.sx;
  __m256 acc[NT], macc[NT];
  for (size_t t = 0; t < NT; ++t) acc[t] = macc[t] = _mm256_setzero_ps();
  const GroupParams8<kParams8> params(il, block, h);
  for (size_t g = 0; g < n_groups; ++g) {
    __m256 d, m;
    params.at(g, d, m);
    for (size_t k = 0; k < blocks_per_group; ++k) {
      const size_t b = g * blocks_per_group + k;
      __m256i dot[NT];
      block_dots<NT>(codes, b, TokenRowsX{xq}, dot);
      for (size_t t = 0; t < NT; ++t) {
        const __m256i sum = _mm256_madd_epi16(dot[t], ones);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, _mm256_set1_ps(xd[t][b])), acc[t]);
        macc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[t][b]), macc[t]);
      }
    }
  }
  for (size_t t = 0; t < NT; ++t) _mm256_storeu_ps(&out[t][8 * h], _mm256_add_ps(acc[t], macc[t]));
}

void block_tokens_avx2(const W4Int8Interleaved& il, size_t block, const Activations& a, size_t t0, size_t n,
                       float (*out)[kBlock]) {
  for (size_t h = 0; h < 2; ++h) {
    if (il.params8()) {
      switch (n) {
        case 4: block8_avx2<4, true>(il, block, h, a, t0, out); break;
        case 3: block8_avx2<3, true>(il, block, h, a, t0, out); break;
        case 2: block8_avx2<2, true>(il, block, h, a, t0, out); break;
        default: block8_avx2<1, true>(il, block, h, a, t0, out); break;
      }
      continue;
    }
    switch (n) {
      case 4: block8_avx2<4, false>(il, block, h, a, t0, out); break;
      case 3: block8_avx2<3, false>(il, block, h, a, t0, out); break;
      case 2: block8_avx2<2, false>(il, block, h, a, t0, out); break;
      default: block8_avx2<1, false>(il, block, h, a, t0, out); break;
    }
  }
}

// Eight tokens' activations side by side for block8x8_avx2: per octet o, 64 bytes, token t's
// four int8 values of columns 8o .. 8o + 3 at 4t and of 8o + 4 .. 8o + 7 at 32 + 4t; per block
// b of 32 columns the tokens' d_xb and float(S_b) * d_xb at [8b + t]. One pointer and constant
// offsets reach every token (eight separate rows would take 24 general registers).
struct Tokens8 {
  std::vector<int8_t> q;
  std::vector<float> d, sx;
};

void interleave_tokens8(const Activations& a, size_t t0, size_t cols, Tokens8& out) {
  const size_t octets = cols / 8, nb = cols / kXBlock;
  out.q.resize(octets * 64);
  out.d.resize(nb * 8);
  out.sx.resize(nb * 8);
  for (size_t t = 0; t < 8; ++t) {
    const int8_t* x = &a.q.q[(t0 + t) * cols];
    for (size_t o = 0; o < octets; ++o) {
      std::memcpy(&out.q[64 * o + 4 * t], x + 8 * o, 4);
      std::memcpy(&out.q[64 * o + 32 + 4 * t], x + 8 * o + 4, 4);
    }
    for (size_t b = 0; b < nb; ++b) {
      out.d[8 * b + t] = a.q.scale[(t0 + t) * nb + b];
      out.sx[8 * b + t] = a.sx[(t0 + t) * nb + b];
    }
  }
}

// block8_avx2 for 8 tokens a pass: each unpacked code vector serves 16 vpmaddubsw instead of 8.
// The tokens' float32 chains acc and macc live in memory (L1), not registers: 8 int16 dot
// accumulators, the codes and the broadcasts fill the 16 ymm registers. The same operations per
// token, in the same order, as block8_avx2: the same bits.
template <bool kParams8>
KESTREL_AVX2_TARGET void block8x8_avx2(const W4Int8Interleaved& il, size_t block, size_t h, const Tokens8& a,
                                       float (*out)[kBlock]) {
  constexpr size_t NT = 8;
  const size_t G = il.group_size, n_groups = il.cols / G, octets = il.cols / 8;
  const size_t blocks_per_group = G / kXBlock;
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* codes = &il.codes[block * octets * 64 + 32 * h];
  alignas(32) float acc[NT][8], macc[NT][8];
  for (size_t t = 0; t < NT; ++t) {
    _mm256_store_ps(acc[t], _mm256_setzero_ps());
    _mm256_store_ps(macc[t], _mm256_setzero_ps());
  }
  const GroupParams8<kParams8> params(il, block, h);
  for (size_t g = 0; g < n_groups; ++g) {
    __m256 d, m;
    params.at(g, d, m);
    for (size_t k = 0; k < blocks_per_group; ++k) {
      const size_t b = g * blocks_per_group + k;
      __m256i dot[NT];
      block_dots<NT>(codes, b, SideBySideX{a.q.data()}, dot);
      const float* xd = &a.d[8 * b];
      const float* xs = &a.sx[8 * b];
      for (size_t t = 0; t < NT; ++t) {
        const __m256i sum = _mm256_madd_epi16(dot[t], ones);
        _mm256_store_ps(acc[t], _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, _mm256_set1_ps(xd[t])),
                                                _mm256_load_ps(acc[t])));
        _mm256_store_ps(macc[t], _mm256_fmadd_ps(m, _mm256_set1_ps(xs[t]), _mm256_load_ps(macc[t])));
      }
    }
  }
  for (size_t t = 0; t < NT; ++t) {
    _mm256_storeu_ps(&out[t][8 * h], _mm256_add_ps(_mm256_load_ps(acc[t]), _mm256_load_ps(macc[t])));
  }
}

void block_tokens8_avx2(const W4Int8Interleaved& il, size_t block, const Tokens8& a, float (*out)[kBlock]) {
  for (size_t h = 0; h < 2; ++h) {
    if (il.params8()) {
      block8x8_avx2<true>(il, block, h, a, out);
    } else {
      block8x8_avx2<false>(il, block, h, a, out);
    }
  }
}

// quantize_super with AVX-512: the same numbers (max|x| exact in any order, an IEEE division,
// rounding to nearest even).
KESTREL_VNNI_TARGET void quantize_super_avx512(const float* x, size_t n_tokens, size_t x_stride, size_t cols, size_t G,
                                               SuperActivations& a) {
  size_super(a, n_tokens, cols, G);
  const __m512 limit = _mm512_set1_ps(127.0f), neg_limit = _mm512_set1_ps(-127.0f);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t k = 0; k < cols / kSuper; ++k) {
      const float* v = x + t * x_stride + k * kSuper;
      __m512 vs[kSuper / 16];
      __m512 m = _mm512_setzero_ps();
      for (size_t j = 0; j < kSuper / 16; ++j) {
        vs[j] = _mm512_loadu_ps(v + 16 * j);
        m = _mm512_max_ps(m, _mm512_abs_ps(vs[j]));
      }
      const float d = _mm512_reduce_max_ps(m) / 127.0f;
      int8_t* out = &a.q[t * cols + k * kSuper];
      if (d > 0.0f) {
        const __m512 dv = _mm512_set1_ps(d);
        for (size_t j = 0; j < kSuper / 16; ++j) {
          const __m512 r = _mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_div_ps(vs[j], dv), kNearest), neg_limit), limit);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * j), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
        }
      } else {
        std::memset(out, 0, kSuper);
      }
      a.dx[t * (cols / kSuper) + k] = d;
    }
    group_sums(a, t, cols, G);
  }
}

// Superblock path, AVX512-VNNI: block `block`'s 16 rows for NT tokens (1..8) from t0 into
// out[t][0..16): the integers of scalar_super (vpdpbusd per group, vpmulld by s_g, vpdpwssd of
// the pairs (n_g, n_g+1) against (S_g, S_g+1)), then its float32 steps.
template <size_t NT, bool kAffine>
KESTREL_VNNI_TARGET void super16(const W4Int8Interleaved& il, size_t block, const SuperActivations& a, size_t t0,
                                 float (*out)[kBlock]) {
  const size_t G = il.group_size, n_groups = il.cols / G, octets = il.cols / 8, gps = kSuper / G;
  const size_t n_super = il.cols / kSuper;
  const __m512i low = _mm512_set1_epi8(0x0F);
  const uint8_t* codes = &il.codes[block * octets * 64];
  const SuperTokens<NT> rows(a, t0, il.cols, G);
  const auto& xq = rows.q;
  const auto& dx = rows.dx;
  const auto& sg = rows.sums;
  __m512 acc1[NT], acc2[NT];
  for (size_t t = 0; t < NT; ++t) acc1[t] = acc2[t] = _mm512_setzero_ps();
  for (size_t k = 0; k < n_super; ++k) {
    __m512i t1[NT];
    for (size_t t = 0; t < NT; ++t) t1[t] = _mm512_setzero_si512();
    for (size_t g = k * gps; g < (k + 1) * gps; ++g) {
      const size_t at = (block * n_groups + g) * kBlock;
      const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(&il.scales8[at])));
      __m512i dot[NT];
      for (size_t t = 0; t < NT; ++t) dot[t] = _mm512_setzero_si512();
      for (size_t o = g * (G / 8); o < (g + 1) * (G / 8); ++o) {
        _mm_prefetch(reinterpret_cast<const char*>(codes + 64 * o + kPrefetchBytes), _MM_HINT_T0);
        const __m512i bytes = _mm512_loadu_si512(codes + 64 * o);
        const __m512i lo = _mm512_and_si512(bytes, low), hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low);
        for (size_t t = 0; t < NT; ++t) {
          dot[t] = _mm512_dpbusd_epi32(dot[t], lo, broadcast4(xq[t] + 8 * o));
          dot[t] = _mm512_dpbusd_epi32(dot[t], hi, broadcast4(xq[t] + 8 * o + 4));
        }
      }
      for (size_t t = 0; t < NT; ++t) {
        __m512i d = dot[t];
        if constexpr (!kAffine) d = _mm512_sub_epi32(d, _mm512_set1_epi32(8 * sg[t][g]));
        t1[t] = _mm512_add_epi32(t1[t], _mm512_mullo_epi32(d, s));
      }
    }
    for (size_t t = 0; t < NT; ++t) acc1[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t1[t]), _mm512_set1_ps(dx[t][k]), acc1[t]);
    if constexpr (kAffine) {
      __m512i pairs[kSuper / 64];  // lane i: (n_g, n_g+1) of row i as two int16 (n_g+1 = 0 past the superblock)
      const size_t n_pairs = (gps + 1) / 2;
      for (size_t p = 0; p < n_pairs; ++p) {
        const size_t g = k * gps + 2 * p, at = (block * n_groups + g) * kBlock;
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(&il.mins8[at])));
        if (2 * p + 1 < gps) {
          v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                                                        reinterpret_cast<const __m128i*>(&il.mins8[at + kBlock]))),
                                                    16));
        }
        pairs[p] = v;
      }
      for (size_t t = 0; t < NT; ++t) {
        __m512i t2 = _mm512_setzero_si512();
        for (size_t p = 0; p < n_pairs; ++p) {
          int32_t s2;
          std::memcpy(&s2, &sg[t][k * gps + 2 * p], sizeof(s2));
          t2 = _mm512_dpwssd_epi32(t2, pairs[p], _mm512_set1_epi32(s2));
        }
        acc2[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t2), _mm512_set1_ps(dx[t][k]), acc2[t]);
      }
    }
  }
  const __m512 row_d = _mm512_loadu_ps(&il.row_d[block * kBlock]);
  for (size_t t = 0; t < NT; ++t) {
    if constexpr (kAffine) {
      const __m512 row_m = _mm512_loadu_ps(&il.row_m[block * kBlock]);
      _mm512_storeu_ps(out[t], _mm512_fmsub_ps(row_d, acc1[t], _mm512_mul_ps(row_m, acc2[t])));
    } else {
      _mm512_storeu_ps(out[t], _mm512_mul_ps(row_d, acc1[t]));
    }
  }
}

template <bool kAffine>
void super_tokens_t(const W4Int8Interleaved& il, size_t block, const SuperActivations& a, size_t t0, size_t n,
                    float (*out)[kBlock]) {
  switch (n) {
    case 8: return super16<8, kAffine>(il, block, a, t0, out);
    case 7: return super16<7, kAffine>(il, block, a, t0, out);
    case 6: return super16<6, kAffine>(il, block, a, t0, out);
    case 5: return super16<5, kAffine>(il, block, a, t0, out);
    case 4: return super16<4, kAffine>(il, block, a, t0, out);
    case 3: return super16<3, kAffine>(il, block, a, t0, out);
    case 2: return super16<2, kAffine>(il, block, a, t0, out);
    default: return super16<1, kAffine>(il, block, a, t0, out);
  }
}

void super_tokens(const W4Int8Interleaved& il, size_t block, const SuperActivations& a, size_t t0, size_t n,
                  float (*out)[kBlock]) {
  if (il.mins8.empty()) return super_tokens_t<false>(il, block, a, t0, n, out);
  super_tokens_t<true>(il, block, a, t0, n, out);
}

// quantize_super with AVX2: the same numbers.
KESTREL_AVX2_TARGET void quantize_super_avx2(const float* x, size_t n_tokens, size_t x_stride, size_t cols, size_t G,
                                             SuperActivations& a) {
  size_super(a, n_tokens, cols, G);
  const __m256 sign = _mm256_set1_ps(-0.0f), limit = _mm256_set1_ps(127.0f), neg_limit = _mm256_set1_ps(-127.0f);
  // packs_epi32 then packs_epi16 interleave 128-bit lanes: this puts the 32 bytes back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t k = 0; k < cols / kSuper; ++k) {
      const float* v = x + t * x_stride + k * kSuper;
      __m256 m = _mm256_setzero_ps();
      for (size_t j = 0; j < kSuper / 8; ++j) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + 8 * j)));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
      const float d = _mm_cvtss_f32(m4) / 127.0f;
      int8_t* out = &a.q[t * cols + k * kSuper];
      if (d > 0.0f) {
        const __m256 dv = _mm256_set1_ps(d);
        for (size_t j = 0; j < kSuper / 32; ++j) {
          __m256i i[4];
          for (size_t h = 0; h < 4; ++h) {
            const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(v + 32 * j + 8 * h), dv),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            i[h] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, neg_limit), limit));
          }
          const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * j), _mm256_permutevar8x32_epi32(bytes, order));
        }
      } else {
        std::memset(out, 0, kSuper);
      }
      a.dx[t * (cols / kSuper) + k] = d;
    }
    group_sums(a, t, cols, G);
  }
}

// Superblock path, AVX2: the 8 rows of half `h` of block `block` for NT tokens (1..4) into
// out[t][8h .. 8h + 8): per 32 columns vpmaddubsw sums in int16 as block8_avx2 does, vpmaddwd by
// ones to int32, then scalar_super's integers (vpmulld by s_g; vpmaddwd of the (n_g, n_g+1)
// pairs against (S_g, S_g+1)) and its float32 steps.
template <size_t NT, bool kAffine>
KESTREL_AVX2_TARGET void super8_avx2(const W4Int8Interleaved& il, size_t block, size_t h, const SuperActivations& a,
                                     size_t t0, float (*out)[kBlock]) {
  const size_t G = il.group_size, n_groups = il.cols / G, octets = il.cols / 8, gps = kSuper / G;
  const size_t n_super = il.cols / kSuper;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const uint8_t* codes = &il.codes[block * octets * 64 + 32 * h];
  const SuperTokens<NT> rows(a, t0, il.cols, G);
  const auto& xq = rows.q;
  const auto& dx = rows.dx;
  const auto& sg = rows.sums;
  __m256 acc1[NT], acc2[NT];
  for (size_t t = 0; t < NT; ++t) acc1[t] = acc2[t] = _mm256_setzero_ps();
  for (size_t k = 0; k < n_super; ++k) {
    __m256i t1[NT];
    for (size_t t = 0; t < NT; ++t) t1[t] = _mm256_setzero_si256();
    for (size_t g = k * gps; g < (k + 1) * gps; ++g) {
      const size_t at = (block * n_groups + g) * kBlock + 8 * h;
      const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&il.scales8[at])));
      __m256i dot[NT];
      for (size_t t = 0; t < NT; ++t) dot[t] = _mm256_setzero_si256();
      for (size_t b = g * (G / kXBlock); b < (g + 1) * (G / kXBlock); ++b) {
        __m256i d16[NT];
        for (size_t t = 0; t < NT; ++t) d16[t] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (size_t o = b * (kXBlock / 8); o < (b + 1) * (kXBlock / 8); ++o) {
          _mm_prefetch(reinterpret_cast<const char*>(codes + 64 * o + kPrefetchBytes), _MM_HINT_T0);
          const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * o));
          const __m256i lo = _mm256_and_si256(bytes, low), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
          for (size_t t = 0; t < NT; ++t) {
            d16[t] = _mm256_add_epi16(d16[t], _mm256_maddubs_epi16(lo, broadcast4_avx2(xq[t] + 8 * o)));
            d16[t] = _mm256_add_epi16(d16[t], _mm256_maddubs_epi16(hi, broadcast4_avx2(xq[t] + 8 * o + 4)));
          }
        }
        for (size_t t = 0; t < NT; ++t) dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(d16[t], ones));
      }
      for (size_t t = 0; t < NT; ++t) {
        __m256i d = dot[t];
        if constexpr (!kAffine) d = _mm256_sub_epi32(d, _mm256_set1_epi32(8 * sg[t][g]));
        t1[t] = _mm256_add_epi32(t1[t], _mm256_mullo_epi32(d, s));
      }
    }
    for (size_t t = 0; t < NT; ++t) acc1[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t1[t]), _mm256_set1_ps(dx[t][k]), acc1[t]);
    if constexpr (kAffine) {
      for (size_t t = 0; t < NT; ++t) {
        __m256i t2 = _mm256_setzero_si256();
        for (size_t g = k * gps; g < (k + 1) * gps; g += 2) {
          const size_t at = (block * n_groups + g) * kBlock + 8 * h;
          __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&il.mins8[at])));
          if (g + 1 < (k + 1) * gps) {
            v = _mm256_or_si256(v, _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                                         reinterpret_cast<const __m128i*>(&il.mins8[at + kBlock]))),
                                                     16));
          }
          int32_t s2;
          std::memcpy(&s2, &sg[t][g], sizeof(s2));
          t2 = _mm256_add_epi32(t2, _mm256_madd_epi16(v, _mm256_set1_epi32(s2)));
        }
        acc2[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t2), _mm256_set1_ps(dx[t][k]), acc2[t]);
      }
    }
  }
  const __m256 row_d = _mm256_loadu_ps(&il.row_d[block * kBlock + 8 * h]);
  for (size_t t = 0; t < NT; ++t) {
    if constexpr (kAffine) {
      const __m256 row_m = _mm256_loadu_ps(&il.row_m[block * kBlock + 8 * h]);
      _mm256_storeu_ps(&out[t][8 * h], _mm256_fmsub_ps(row_d, acc1[t], _mm256_mul_ps(row_m, acc2[t])));
    } else {
      _mm256_storeu_ps(&out[t][8 * h], _mm256_mul_ps(row_d, acc1[t]));
    }
  }
}

template <bool kAffine>
void super_tokens_avx2_t(const W4Int8Interleaved& il, size_t block, const SuperActivations& a, size_t t0, size_t n,
                         float (*out)[kBlock]) {
  for (size_t h = 0; h < 2; ++h) {
    switch (n) {
      case 4: super8_avx2<4, kAffine>(il, block, h, a, t0, out); break;
      case 3: super8_avx2<3, kAffine>(il, block, h, a, t0, out); break;
      case 2: super8_avx2<2, kAffine>(il, block, h, a, t0, out); break;
      default: super8_avx2<1, kAffine>(il, block, h, a, t0, out); break;
    }
  }
}

void super_tokens_avx2(const W4Int8Interleaved& il, size_t block, const SuperActivations& a, size_t t0, size_t n,
                       float (*out)[kBlock]) {
  if (il.mins8.empty()) return super_tokens_avx2_t<false>(il, block, a, t0, n, out);
  super_tokens_avx2_t<true>(il, block, a, t0, n, out);
}

#endif  // KESTREL_HAVE_VNNI

void scalar(const W4Int8Interleaved& il, const Activations& a, size_t n_tokens, float* y, size_t y_stride,
            size_t row_begin, size_t row_end) {
  const size_t G = il.group_size, n_groups = il.cols / G, octets = il.cols / 8, nb = il.cols / kXBlock;
  for (size_t r = row_begin; r < row_end; ++r) {
    const size_t block = r / kBlock, i = r % kBlock;
    const uint8_t* codes = &il.codes[block * octets * 64];
    for (size_t t = 0; t < n_tokens; ++t) {
      const int8_t* xq = &a.q.q[t * il.cols];
      float acc = 0.0f, macc = 0.0f;
      for (size_t b = 0; b < nb; ++b) {
        const size_t g = b * kXBlock / G, at = (block * n_groups + g) * kBlock + i;
        float d, m;
        if (il.params8()) {
          d = il.row_d[r] * static_cast<float>(il.scales8[at]);
          m = il.mins8.empty() ? d * -8.0f : -il.row_m[r] * static_cast<float>(il.mins8[at]);
        } else {
          d = gguf::fp16_to_fp32(il.scales[at]);
          m = gguf::fp16_to_fp32(il.mins[at]);
        }
        int32_t dot = 0;
        for (size_t c = b * kXBlock; c < (b + 1) * kXBlock; ++c) {
          const uint8_t byte = codes[(c / 8) * 64 + code_byte(i, c % 8)];
          const int32_t q = c % 8 < 4 ? byte & 0x0F : byte >> 4;
          dot += q * xq[c];
        }
        const float dx = a.q.scale[t * nb + b];
        acc = std::fma(static_cast<float>(dot), d * dx, acc);
        macc = std::fma(m, a.sx[t * nb + b], macc);
      }
      y[t * y_stride + r] = acc + macc;
    }
  }
}

}  // namespace

bool w4_int8_default() {
  switch (kernel_options().activations) {
    case DecodeActivations::kInt8: return true;
    case DecodeActivations::kBf16: return false;
    case DecodeActivations::kAuto: break;
  }
  return int8_simd_available();
}

bool w4_int8_chosen(DecodeActivations a) {
  return a == DecodeActivations::kInt8 || (a == DecodeActivations::kAuto && w4_int8_default());
}

DecodeActivations parse_decode_activations(const std::string& name) {
  if (name == "auto") return DecodeActivations::kAuto;
  if (name == "bf16") return DecodeActivations::kBf16;
  if (name == "int8") return DecodeActivations::kInt8;
  throw Error("decode activations must be auto, bf16 or int8 (got '" + name + "')");
}

bool w4_int8_supported(const Matrix& w) {
  const bool params = w.scales != nullptr || (w.scales8 != nullptr && w.row_scales != nullptr);
  return w.type == WeightType::kW4 && params && w4_int8_shape_supported(w.rows, w.cols, w.group_size);
}

bool w4_int8_shape_supported(size_t rows, size_t cols, size_t group_size) {
  return rows > 0 && rows % kBlock == 0 && group_size > 0 && group_size % kXBlock == 0 && cols % group_size == 0;
}

size_t W4Int8Storage::bytes() const {
  return codes.size() + scales.size() * sizeof(uint16_t) + mins.size() * sizeof(uint16_t) + scales8.size() +
         mins8.size() + (row_d.size() + row_m.size() + w8_scale.size()) * sizeof(float) + w8.size() +
         (previous ? previous->bytes() : 0);
}

W4Int8Interleaved interleave_w4_int8(const Matrix& w, ThreadPool* pool) {
  W4Int8Interleaved il = interleave_w4_int8_layout(w, pool);
  if (superblocks(il) && w8a8_default()) requantize_w8(w, il, pool);
  return il;
}

W4Int8Interleaved interleave_w4_int8_layout(const Matrix& w, ThreadPool* pool) {
  if (!w4_int8_supported(w)) {
    throw Error("interleave_w4_int8: not an INT4 matrix with rows a multiple of 16 and groups a multiple of 32");
  }
  const size_t G = w.group_size, half = G / 2, n_groups = w.cols / G, octets = w.cols / 8;
  W4Int8Interleaved il;
  il.rows = w.rows;
  il.cols = w.cols;
  il.group_size = G;
  il.owned = std::make_shared<W4Int8Storage>();
  W4Int8Storage& s = *il.owned;
  s.codes.resize(il.rows / kBlock * octets * 64);
  const bool params8 = w.scales == nullptr;
  if (params8) {
    s.scales8.resize(il.rows * n_groups);
    if (w.mins8 != nullptr) s.mins8.resize(il.rows * n_groups);
    s.row_d.resize(il.rows);
    s.row_m.resize(il.rows);
  } else {
    s.scales.resize(il.rows * n_groups);
    s.mins.resize(il.rows * n_groups);
  }
  // Blocks [b0, b1) of 16 rows. Row-major source: a group's byte j holds weight j (low nibble)
  // and j + G / 2 (high) (matmul.h); each row's codes are unpacked to one byte per weight, then
  // packed as code_byte() places them: byte 4 i + e of octet o holds row i's columns 8 o + e
  // (low nibble) and 8 o + e + 4 (high), e < 4.
  auto blocks = [&](size_t b0, size_t b1) {
    std::vector<uint8_t> codes(w.cols);
    // Locals, not the captures: byte stores may alias anything, so the compiler would reload
    // captured sizes and pointers after each one.
    uint8_t* q = codes.data();
    const size_t n_half = half, group = G;
    for (size_t block = b0; block < b1; ++block) {
      for (size_t i = 0; i < kBlock; ++i) {
        const size_t r = block * kBlock + i;
        const uint8_t* row = w.row(r);
        for (size_t g = 0; g < n_groups; ++g) {
          const uint8_t* src = row + g * n_half;
          uint8_t* low = q + g * group;
          uint8_t* high = low + n_half;
          for (size_t j = 0; j < n_half; ++j) {
            low[j] = src[j] & 0x0F;
            high[j] = src[j] >> 4;
          }
        }
        uint8_t* dst = &s.codes[block * octets * 64 + 4 * i];
        for (size_t o = 0; o < octets; ++o) {
          // Four bytes at once: codes are < 16, so the shift moves each into its byte's high nibble.
          uint32_t low4, high4;
          std::memcpy(&low4, &q[8 * o], 4);
          std::memcpy(&high4, &q[8 * o + 4], 4);
          const uint32_t packed = low4 | (high4 << 4);
          std::memcpy(&dst[o * 64], &packed, 4);
        }
        if (params8) {
          s.row_d[r] = gguf::fp16_to_fp32(w.row_scales[2 * r]);
          s.row_m[r] = gguf::fp16_to_fp32(w.row_scales[2 * r + 1]);
        }
        for (size_t g = 0; g < n_groups; ++g) {
          const size_t at = (block * n_groups + g) * kBlock + i;
          if (params8) {
            s.scales8[at] = w.scales8[r * n_groups + g];
            if (w.mins8 != nullptr) s.mins8[at] = w.mins8[r * n_groups + g];
            continue;
          }
          const uint16_t d = w.scales[r * n_groups + g];
          s.scales[at] = d;
          // Symmetric groups: m = -8 d, exact in fp16 (a power-of-two multiple).
          s.mins[at] = w.mins != nullptr ? w.mins[r * n_groups + g] : gguf::fp32_to_fp16(-8.0f * gguf::fp16_to_fp32(d));
        }
      }
    }
  };
  const size_t n_blocks = il.rows / kBlock;
  if (pool != nullptr) {
    pool->parallel_for(n_blocks, 1, blocks);
  } else {
    blocks(0, n_blocks);
  }
  il.codes = s.codes;
  il.scales = s.scales;
  il.mins = s.mins;
  il.scales8 = s.scales8;
  il.mins8 = s.mins8;
  il.row_d = s.row_d;
  il.row_m = s.row_m;
  return il;
}

void check_w4_int8_layout(const W4Int8Interleaved& il) {
  if (!w4_int8_shape_supported(il.rows, il.cols, il.group_size)) {
    throw Error("int8 layout: " + std::to_string(il.rows) + " x " + std::to_string(il.cols) + " in groups of " +
                std::to_string(il.group_size) + " is not a shape the int8 kernels run");
  }
  const size_t n_params = il.rows * (il.cols / il.group_size);
  const bool sizes16 = il.scales.size() == n_params && il.mins.size() == n_params && il.scales8.empty() &&
                       il.mins8.empty() && il.row_d.empty() && il.row_m.empty();
  const bool sizes8 = il.scales.empty() && il.mins.empty() && il.scales8.size() == n_params &&
                      (il.mins8.empty() || il.mins8.size() == n_params) && il.row_d.size() == il.rows &&
                      il.row_m.size() == il.rows;
  const bool w8 = (il.w8.empty() && il.w8_scale.empty()) ||
                  (il.w8.size() == il.rows * il.cols && il.w8_scale.size() == il.rows);
  if (il.codes.size() != il.rows * il.cols / 2 || !(sizes16 || sizes8) || !w8) {
    throw Error("int8 layout of " + std::to_string(il.rows) + " x " + std::to_string(il.cols) +
                ": its codes or group parameters do not have the layout's sizes");
  }
}

quant::W4Matrix deinterleave_w4_int8(const W4Int8Interleaved& il, bool zero_points, ThreadPool* pool) {
  check_w4_int8_layout(il);
  const size_t G = il.group_size, half = G / 2, n_groups = il.cols / G, octets = il.cols / 8;
  const bool params8 = il.params8();
  quant::W4Matrix w;
  w.rows = il.rows;
  w.cols = il.cols;
  w.group_size = G;
  w.qs.resize(il.rows * il.cols / 2);
  if (params8) {
    w.scales8.resize(il.rows * n_groups);
    if (!il.mins8.empty()) w.mins8.resize(il.rows * n_groups);
    w.row_scales.resize(2 * il.rows);
  } else {
    w.scales.resize(il.rows * n_groups);
    if (zero_points) w.mins.resize(il.rows * n_groups);
  }
  // Blocks [b0, b1) of 16 rows: interleave_w4_int8_layout's steps backwards. Byte 4 i + e of
  // octet o holds row i's columns 8 o + e (low nibble) and 8 o + e + 4 (high), e < 4; the
  // row-major group's byte j holds its weight j (low) and j + G / 2 (high).
  auto blocks = [&](size_t b0, size_t b1) {
    std::vector<uint8_t> codes(il.cols);
    uint8_t* q = codes.data();
    for (size_t block = b0; block < b1; ++block) {
      for (size_t i = 0; i < kBlock; ++i) {
        const size_t r = block * kBlock + i;
        const uint8_t* src = &il.codes[block * octets * 64 + 4 * i];
        for (size_t o = 0; o < octets; ++o) {
          for (size_t e = 0; e < 4; ++e) {
            q[8 * o + e] = src[o * 64 + e] & 0x0F;
            q[8 * o + 4 + e] = src[o * 64 + e] >> 4;
          }
        }
        uint8_t* row = &w.qs[r * il.cols / 2];
        for (size_t g = 0; g < n_groups; ++g) {
          const uint8_t* low = q + g * G;
          for (size_t j = 0; j < half; ++j) row[g * half + j] = static_cast<uint8_t>(low[j] | (low[j + half] << 4));
        }
        if (params8) {
          w.row_scales[2 * r] = gguf::fp32_to_fp16(il.row_d[r]);
          w.row_scales[2 * r + 1] = gguf::fp32_to_fp16(il.row_m[r]);
        }
        for (size_t g = 0; g < n_groups; ++g) {
          const size_t at = (block * n_groups + g) * kBlock + i;
          if (params8) {
            w.scales8[r * n_groups + g] = il.scales8[at];
            if (!il.mins8.empty()) w.mins8[r * n_groups + g] = il.mins8[at];
            continue;
          }
          w.scales[r * n_groups + g] = il.scales[at];
          if (zero_points) w.mins[r * n_groups + g] = il.mins[at];
        }
      }
    }
  };
  const size_t n_blocks = il.rows / kBlock;
  if (pool != nullptr) {
    pool->parallel_for(n_blocks, 1, blocks);
  } else {
    blocks(0, n_blocks);
  }
  return w;
}

void add_default_w8a8(W4Int8Interleaved& il, bool zero_points, ThreadPool* pool) {
  if (!superblocks(il) || !w8a8_default() || !il.w8.empty()) return;
  const quant::W4Matrix rows = deinterleave_w4_int8(il, zero_points, pool);
  requantize_w8(rows.view(), il, pool);
}


void gemv_w4_int8_scalar(const W4Int8Interleaved& il, const float* x, size_t n_tokens, size_t x_stride, float* y,
                         size_t y_stride, size_t row_begin, size_t row_end) {
  gemv_w4_int8_on(Int8Isa::kPortable, il, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
}

void gemv_w4_int8(const W4Int8Interleaved& il, const float* x, size_t n_tokens, size_t x_stride, float* y,
                  size_t y_stride, size_t row_begin, size_t row_end, size_t product_tokens) {
  gemv_w4_int8_on(best_int8_isa(), il, x, n_tokens, x_stride, y, y_stride, row_begin, row_end, product_tokens);
}

void gemv_w4_int8_on(Int8Isa isa, const W4Int8Interleaved& il, const float* x, size_t n_tokens, size_t x_stride,
                     float* y, size_t y_stride, size_t row_begin, size_t row_end, size_t product_tokens) {
  check(il, row_begin, row_end);
  if (!int8_isa_available(isa)) throw Error(std::string("gemv_w4_int8: ") + int8_isa_name(isa) + " is not available");
  const bool super = superblocks(il);
  thread_local Activations a;
  thread_local SuperActivations sa;
  if (super && std::max(n_tokens, product_tokens) >= kTileMinTokens && !il.w8.empty()) {
    quantize_super_on(isa, x, n_tokens, x_stride, il.cols, kSuper, sa);
    gemm_w8a8_on(isa, il, sa, n_tokens, y, y_stride, row_begin, row_end);
    return;
  }
#ifdef KESTREL_HAVE_VNNI
  if (isa != Int8Isa::kPortable) {
    const bool vnni = isa == Int8Isa::kAvx512Vnni;
    if (super) {
      quantize_super_on(isa, x, n_tokens, x_stride, il.cols, il.group_size, sa);
    } else if (vnni) {
      quantize_avx512(x, n_tokens, x_stride, il.cols, a);
    } else {
      quantize_avx2(x, n_tokens, x_stride, il.cols, a);
    }
    float out[kMaxTileTokensVnni][kBlock];
    const size_t tile = vnni ? kMaxTileTokensVnni : kMaxTileTokens;
    // AVX2 without superblocks: whole groups of 8 tokens take block8x8_avx2, the rest 4 at a time.
    const size_t wide = !super && !vnni ? n_tokens / 8 * 8 : 0;
    thread_local std::vector<Tokens8> groups;
    if (groups.size() < wide / 8) groups.resize(wide / 8);
    for (size_t i = 0; i < wide / 8; ++i) interleave_tokens8(a, 8 * i, il.cols, groups[i]);
    for (size_t blk = row_begin / kBlock; blk * kBlock < row_end; ++blk) {
      const size_t lo = std::max(row_begin, blk * kBlock), hi = std::min(row_end, (blk + 1) * kBlock);
      for (size_t t0 = 0; t0 < wide; t0 += 8) {
        block_tokens8_avx2(il, blk, groups[t0 / 8], out);
        for (size_t t = 0; t < 8; ++t) {
          std::copy(&out[t][lo - blk * kBlock], &out[t][hi - blk * kBlock], y + (t0 + t) * y_stride + lo);
        }
      }
      for (size_t t0 = wide; t0 < n_tokens; t0 += tile) {
        const size_t n = std::min(tile, n_tokens - t0);
        if (super) {
          (vnni ? super_tokens : super_tokens_avx2)(il, blk, sa, t0, n, out);
        } else if (vnni) {
          block_tokens(il, blk, a, t0, n, out);
        } else {
          block_tokens_avx2(il, blk, a, t0, n, out);
        }
        for (size_t t = 0; t < n; ++t) {
          std::copy(&out[t][lo - blk * kBlock], &out[t][hi - blk * kBlock], y + (t0 + t) * y_stride + lo);
        }
      }
    }
    return;
  }
#endif
  if (super) {
    quantize_super(x, n_tokens, x_stride, il.cols, il.group_size, sa);
    scalar_super(il, sa, n_tokens, y, y_stride, row_begin, row_end);
    return;
  }
  quantize(x, n_tokens, x_stride, il.cols, a);
  scalar(il, a, n_tokens, y, y_stride, row_begin, row_end);
}

bool w4_int8_superblocks(const W4Int8Interleaved& il) { return superblocks(il); }

void quantize_super_on(Int8Isa isa, const float* x, size_t n_tokens, size_t x_stride, size_t cols, size_t G,
                       SuperActivations& a) {
  if (!int8_isa_available(isa)) throw Error(std::string("quantize_super: ") + int8_isa_name(isa) + " is not available");
#ifdef KESTREL_HAVE_VNNI
  if (isa == Int8Isa::kAvx512Vnni) return quantize_super_avx512(x, n_tokens, x_stride, cols, G, a);
  if (isa == Int8Isa::kAvx2) return quantize_super_avx2(x, n_tokens, x_stride, cols, G, a);
#endif
  quantize_super(x, n_tokens, x_stride, cols, G, a);
}

}  // namespace kestrel::kernels
