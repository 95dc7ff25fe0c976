#include "kestrel/kernels/gemv_w4_interleaved.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemm_bf16.h"
#include "kestrel/kernels/kernel_options.h"

#include "kestrel/kernels/x86_bf16.h"

namespace kestrel::kernels {
namespace {

constexpr size_t kBlock = kInterleaveRows;
constexpr size_t kMaxTileTokens = 4;  // tokens per pass over a block (more would spill registers)
constexpr size_t kPrefetchBytes = 1024;          // codes requested this far ahead
constexpr size_t kPrefetchParams = 8 * kBlock;   // group parameters requested 8 groups ahead

// Byte (0..63) of an 8-column load holding row i's column 8o + e, e = 2v + j: vector v of the
// unpacking (0, 1: low nibbles of bytes 0-7 / 8-15 of each 16-byte lane; 2, 3: their high
// nibbles) holds columns 8o + 2v, 8o + 2v + 1 of row i in float32 lane i, i.e. words 2i, 2i + 1,
// which vpunpck[lh]bw takes from byte (2i + j) % 8 (+ 8 for v odd) of 16-byte lane i / 4.
size_t interleaved_byte(size_t i, size_t e) { return 16 * (i / 4) + ((e / 2) & 1) * 8 + (2 * i + e % 2) % 8; }

#ifdef KESTREL_HAVE_BF16_DOT

KESTREL_BF16_TARGET inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// 16 bytes as 16 float32 lanes.
KESTREL_BF16_TARGET inline __m512 u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Block `block`'s 16 rows for NT tokens (1..4) into out[t][0..16). x[t]: bf16 activations in
// column order; sums[t]: their per-group float32 sums.
template <size_t NT, bool kParams8>
KESTREL_BF16_TARGET void block16(const W4Interleaved& il, size_t block, const uint16_t* const* x,
                                 const float* const* sums, float (*out)[kBlock]) {
  const size_t G = il.group_size, n_groups = il.cols / G, octets = il.cols / 8;
  const __m512i low = _mm512_set1_epi8(0x0F), bias = _mm512_set1_epi8(0x43);
  __m512 acc[NT], offset_acc[NT];
  for (size_t t = 0; t < NT; ++t) acc[t] = offset_acc[t] = _mm512_setzero_ps();
  const uint8_t* codes = &il.codes[block * octets * 64];
  __m512 row_d = _mm512_setzero_ps(), neg_row_m = _mm512_setzero_ps();
  if constexpr (kParams8) {
    row_d = _mm512_loadu_ps(&il.row_d[block * kBlock]);
    neg_row_m = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_loadu_ps(&il.row_m[block * kBlock])),
                                                     _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  }
  for (size_t g = 0; g < n_groups; ++g) {
    // Four partial sums per token, one per unpacked vector: each dependency chain takes one
    // vdpbf16ps per octet, so NT x 4 chains hide the instruction's latency.
    __m512 dot[NT][4];
    for (size_t t = 0; t < NT; ++t) dot[t][0] = dot[t][1] = dot[t][2] = dot[t][3] = _mm512_setzero_ps();
    for (size_t oi = 0; oi < G / 8; ++oi) {
      const size_t o = g * (G / 8) + oi;
      // The codes stream from memory in decode: ask for them kPrefetchBytes ahead (a prefetch
      // past the end does not fault), as gemv_w4_bf16 does.
      _mm_prefetch(reinterpret_cast<const char*>(codes + 64 * o + kPrefetchBytes), _MM_HINT_T0);
      const __m512i bytes = _mm512_loadu_si512(codes + 64 * o);
      const __m512i lo = _mm512_and_si512(bytes, low), hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low);
      const __m512bh w0 = as_bh(_mm512_unpacklo_epi8(lo, bias)), w1 = as_bh(_mm512_unpackhi_epi8(lo, bias)),
                     w2 = as_bh(_mm512_unpacklo_epi8(hi, bias)), w3 = as_bh(_mm512_unpackhi_epi8(hi, bias));
      for (size_t t = 0; t < NT; ++t) {
        int32_t pairs[4];  // the bf16 pairs of columns 8o + 2v, 8o + 2v + 1
        std::memcpy(pairs, x[t] + 8 * o, sizeof(pairs));
        dot[t][0] = _mm512_dpbf16_ps(dot[t][0], w0, as_bh(_mm512_set1_epi32(pairs[0])));
        dot[t][1] = _mm512_dpbf16_ps(dot[t][1], w1, as_bh(_mm512_set1_epi32(pairs[1])));
        dot[t][2] = _mm512_dpbf16_ps(dot[t][2], w2, as_bh(_mm512_set1_epi32(pairs[2])));
        dot[t][3] = _mm512_dpbf16_ps(dot[t][3], w3, as_bh(_mm512_set1_epi32(pairs[3])));
      }
    }
    const size_t at = (block * n_groups + g) * kBlock;
    __m512 d, m;
    if constexpr (kParams8) {
      // d = d_row * s_g, m = -m_row * n_g (float32 products, as w4_group_params forms them).
      d = _mm512_mul_ps(row_d, u8(&il.scales8[at]));
      m = il.mins8.empty() ? _mm512_mul_ps(d, _mm512_set1_ps(-8.0f)) : _mm512_mul_ps(neg_row_m, u8(&il.mins8[at]));
    } else {
      _mm_prefetch(reinterpret_cast<const char*>(il.scales.data() + at + kPrefetchParams), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(il.mins.data() + at + kPrefetchParams), _MM_HINT_T0);
      d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&il.scales[at])));
      m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&il.mins[at])));
    }
    const __m512 offset = _mm512_fnmadd_ps(d, _mm512_set1_ps(128.0f), m);
    for (size_t t = 0; t < NT; ++t) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(dot[t][0], dot[t][1]), _mm512_add_ps(dot[t][2], dot[t][3]));
      acc[t] = _mm512_fmadd_ps(sum, d, acc[t]);
      offset_acc[t] = _mm512_fmadd_ps(offset, _mm512_set1_ps(sums[t][g]), offset_acc[t]);
    }
  }
  for (size_t t = 0; t < NT; ++t) _mm512_storeu_ps(out[t], _mm512_add_ps(acc[t], offset_acc[t]));
}

void block_tokens(const W4Interleaved& il, size_t block, size_t n, const uint16_t* const* x,
                  const float* const* sums, float (*out)[kBlock]) {
  if (il.params8()) {
    switch (n) {
      case 4: return block16<4, true>(il, block, x, sums, out);
      case 3: return block16<3, true>(il, block, x, sums, out);
      case 2: return block16<2, true>(il, block, x, sums, out);
      default: return block16<1, true>(il, block, x, sums, out);
    }
  }
  switch (n) {
    case 4: return block16<4, false>(il, block, x, sums, out);
    case 3: return block16<3, false>(il, block, x, sums, out);
    case 2: return block16<2, false>(il, block, x, sums, out);
    default: return block16<1, false>(il, block, x, sums, out);
  }
}

// sums[g] = sum of the bf16 values x[g * G, (g + 1) * G) in float32 (G a multiple of 8).
KESTREL_BF16_TARGET void bf16_group_sums(const uint16_t* x, size_t cols, size_t G, float* sums) {
  for (size_t g = 0; g < cols / G; ++g) {
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = g * G; i < (g + 1) * G; i += 8) {
      const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
      acc = _mm256_add_ps(acc, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16)));
    }
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    sums[g] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
}

#endif  // KESTREL_HAVE_BF16_DOT

}  // namespace

bool w4_interleavable(const Matrix& w) {
  const bool params = w.scales != nullptr || (w.scales8 != nullptr && w.row_scales != nullptr);
  return kernel_options().interleave && w.type == WeightType::kW4 && params && w.rows % kBlock == 0 && w.rows > 0 && w.group_size % 8 == 0 &&
         w.group_size > 0 && w.cols % w.group_size == 0 && bf16_dot_available();
}

W4Interleaved interleave_w4(const Matrix& w) {
  if (!w4_interleavable(w)) throw Error("interleave_w4: not an INT4 matrix the interleaved kernel runs");
  const size_t G = w.group_size, half = G / 2, n_groups = w.cols / G, octets = w.cols / 8;
  W4Interleaved il;
  il.rows = w.rows;
  il.cols = w.cols;
  il.group_size = G;
  il.codes.assign(il.rows / kBlock * octets * 64, 0);
  const bool params8 = w.scales == nullptr;
  if (params8) {
    il.scales8.resize(il.rows * n_groups);
    if (w.mins8 != nullptr) il.mins8.resize(il.rows * n_groups);
    il.row_d.resize(il.rows);
    il.row_m.resize(il.rows);
  } else {
    il.scales.resize(il.rows * n_groups);
    il.mins.resize(il.rows * n_groups);
  }
  for (size_t r = 0; r < il.rows; ++r) {
    const size_t block = r / kBlock, i = r % kBlock;
    const uint8_t* row = w.row(r);
    for (size_t o = 0; o < octets; ++o) {
      // Columns 8o .. 8o + 7 lie in one half of a group: 8 consecutive bytes' low nibbles (first
      // half) or high nibbles (second half) in the row-major layout (matmul.h).
      const size_t c = 8 * o, g = c / G, within = c % G;
      const uint8_t* src = row + g * half + within % half;
      const bool high = within >= half;
      uint8_t* dst = &il.codes[(block * octets + o) * 64];
      for (size_t e = 0; e < 8; ++e) {
        const uint8_t q = high ? src[e] >> 4 : src[e] & 0x0F;
        dst[interleaved_byte(i, e)] |= e >= 4 ? static_cast<uint8_t>(q << 4) : q;
      }
    }
    if (params8) {
      il.row_d[r] = gguf::fp16_to_fp32(w.row_scales[2 * r]);
      il.row_m[r] = gguf::fp16_to_fp32(w.row_scales[2 * r + 1]);
      for (size_t g = 0; g < n_groups; ++g) {
        const size_t at = (block * n_groups + g) * kBlock + i;
        il.scales8[at] = w.scales8[r * n_groups + g];
        if (w.mins8 != nullptr) il.mins8[at] = w.mins8[r * n_groups + g];
      }
      continue;
    }
    for (size_t g = 0; g < n_groups; ++g) {
      const size_t at = (block * n_groups + g) * kBlock + i;
      const uint16_t d = w.scales[r * n_groups + g];
      il.scales[at] = d;
      // Symmetric groups: m = -8 d, exact in fp16 (a power-of-two multiple).
      il.mins[at] = w.mins != nullptr ? w.mins[r * n_groups + g] : gguf::fp32_to_fp16(-8.0f * gguf::fp16_to_fp32(d));
    }
  }
  return il;
}

void gemv_w4_interleaved(const W4Interleaved& il, const float* x, size_t n_tokens, size_t x_stride, float* y,
                         size_t y_stride, size_t row_begin, size_t row_end) {
#ifdef KESTREL_HAVE_BF16_DOT
  const size_t G = il.group_size;
  thread_local std::vector<uint16_t> x16;
  thread_local std::vector<float> group_sums;
  x16.resize(n_tokens * il.cols);
  group_sums.resize(n_tokens * (il.cols / G));
  const uint16_t* xs[kTileMinTokens];
  const float* sums[kTileMinTokens];
  for (size_t t = 0; t < n_tokens; ++t) {
    uint16_t* xt = &x16[t * il.cols];
    float* st = &group_sums[t * (il.cols / G)];
    to_bf16(x + t * x_stride, xt, il.cols);
    bf16_group_sums(xt, il.cols, G, st);
    xs[t] = xt;
    sums[t] = st;
  }
  const size_t end = std::min(row_end, il.rows);
  float out[kMaxTileTokens][kBlock];
  for (size_t b = row_begin / kBlock; b * kBlock < end; ++b) {
    const size_t lo = std::max(row_begin, b * kBlock), hi = std::min(end, (b + 1) * kBlock);
    for (size_t t0 = 0; t0 < n_tokens; t0 += kMaxTileTokens) {
      const size_t n = std::min(kMaxTileTokens, n_tokens - t0);
      block_tokens(il, b, n, xs + t0, sums + t0, out);
      for (size_t t = 0; t < n; ++t) {
        std::copy(&out[t][lo - b * kBlock], &out[t][hi - b * kBlock], y + (t0 + t) * y_stride + lo);
      }
    }
  }
#else
  (void)il, (void)x, (void)n_tokens, (void)x_stride, (void)y, (void)y_stride, (void)row_begin,
      (void)row_end;
#endif
}

}  // namespace kestrel::kernels
