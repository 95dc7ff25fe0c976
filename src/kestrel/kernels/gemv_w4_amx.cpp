#include "kestrel/kernels/gemv_w4_amx.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kestrel/base/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 intrinsics start from a self-initialized "undefined" vector (as in gemv_w4_int8.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define KESTREL_HAVE_AMX 1
#define KESTREL_AMX_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni,f16c")))
#endif

namespace kestrel::kernels {
namespace {

constexpr size_t kBlock = 16;   // rows per interleaved block
constexpr size_t kXBlock = 32;  // columns per activation block (the 32-column formula)
constexpr size_t kNT = kAmxTokens;

#ifdef KESTREL_HAVE_AMX

// LDTILECFG's 64 bytes (Intel SDM vol. 2, "LDTILECFG"): palette 1, per tile its rows and bytes
// per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0: 8 x 16 int32 sums; tmm1: 8 tokens x k int8 activations; tmm2: k / 4 x 64 bytes of codes.
KESTREL_AMX_TARGET void configure(size_t k) {
  TileConfig c;
  c.rows[0] = kNT;
  c.colsb[0] = 64;
  c.rows[1] = kNT;
  c.colsb[1] = static_cast<uint16_t>(k);
  c.rows[2] = static_cast<uint8_t>(k / 4);
  c.colsb[2] = 64;
  _tile_loadconfig(&c);
}

// Block `block`'s codes as rows of tile B, [il.cols / 4][64] bytes into b: row 2o the low
// nibbles of octet o (columns 8o .. 8o + 3 of each row's 32-bit lane), row 2o + 1 the high ones.
KESTREL_AMX_TARGET void split_nibbles(const W4Int8Interleaved& il, size_t block, uint8_t* b) {
  const size_t octets = il.cols / 8;
  const uint8_t* codes = &il.codes[block * octets * 64];
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (size_t o = 0; o < octets; ++o) {
    const __m512i bytes = _mm512_loadu_si512(codes + 64 * o);
    _mm512_storeu_si512(b + 128 * o, _mm512_and_si512(bytes, low));
    _mm512_storeu_si512(b + 128 * o + 64, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low));
  }
  // The tile loads are asm statements that name only their addresses: the stores above must
  // reach memory before them.
  __asm__ volatile("" ::: "memory");
}

// The exact int32 D[t][i] = sum_{c in [c0, c0 + k * steps)} q_ic * xq_tc for the 8 tokens whose
// activations start at xq (rows `cols` bytes apart) and the 16 rows of tile-B rows b.
KESTREL_AMX_TARGET inline void dots(const int8_t* xq, size_t cols, const uint8_t* b, size_t c0, size_t k,
                                    size_t steps, int32_t (*d)[kBlock]) {
  _tile_zero(0);
  for (size_t s = 0; s < steps; ++s) {
    _tile_loadd(1, xq + c0 + s * k, cols);
    _tile_loadd(2, b + (c0 + s * k) * 16, 64);
    _tile_dpbsud(0, 1, 2);
  }
  _tile_stored(0, d, 64);
}

// Growable 64-byte aligned scratch for a block's tile-B rows, one per thread.
uint8_t* scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < bytes + 64) buffer.resize(bytes + 64);
  const auto at = reinterpret_cast<uintptr_t>(buffer.data());
  return buffer.data() + ((64 - at % 64) % 64);
}

KESTREL_AMX_TARGET inline __m512 u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// The 32-column formula for tokens t0 .. t0 + 8: block16 of gemv_w4_int8.cpp with D from tiles.
template <bool kParams8>
KESTREL_AMX_TARGET void blocks8(const W4Int8Interleaved& il, size_t block, const uint8_t* b, const int8_t* xq,
                                const float* xd, const float* xs, size_t t0, float (*out)[kBlock]) {
  const size_t G = il.group_size, n_groups = il.cols / G, nb = il.cols / kXBlock, blocks_per_group = G / kXBlock;
  const int8_t* x = xq + t0 * il.cols;
  __m512 acc[kNT], macc[kNT];
  for (size_t t = 0; t < kNT; ++t) acc[t] = macc[t] = _mm512_setzero_ps();
  __m512 row_d = _mm512_setzero_ps(), neg_row_m = _mm512_setzero_ps();
  if constexpr (kParams8) {
    row_d = _mm512_loadu_ps(&il.row_d[block * kBlock]);
    neg_row_m = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_loadu_ps(&il.row_m[block * kBlock])),
                                                     _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  }
  alignas(64) int32_t dot[kNT][kBlock];
  for (size_t g = 0; g < n_groups; ++g) {
    const size_t at = (block * n_groups + g) * kBlock;
    __m512 d, m;
    if constexpr (kParams8) {
      d = _mm512_mul_ps(row_d, u8(&il.scales8[at]));
      m = il.mins8.empty() ? _mm512_mul_ps(d, _mm512_set1_ps(-8.0f)) : _mm512_mul_ps(neg_row_m, u8(&il.mins8[at]));
    } else {
      d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&il.scales[at])));
      m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&il.mins[at])));
    }
    for (size_t k = 0; k < blocks_per_group; ++k) {
      const size_t bl = g * blocks_per_group + k;
      dots(x, il.cols, b, bl * kXBlock, kXBlock, 1, dot);
      for (size_t t = 0; t < kNT; ++t) {
        const size_t j = (t0 + t) * nb + bl;
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dot[t])), _mm512_mul_ps(d, _mm512_set1_ps(xd[j])),
                                 acc[t]);
        macc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[j]), macc[t]);
      }
    }
  }
  for (size_t t = 0; t < kNT; ++t) _mm512_storeu_ps(out[t], _mm512_add_ps(acc[t], macc[t]));
}

// The superblock formula for tokens t0 .. t0 + 8: super16 of gemv_w4_int8.cpp with D from tiles.
template <bool kAffine>
KESTREL_AMX_TARGET void super8(const W4Int8Interleaved& il, size_t block, const uint8_t* b, const SuperActivations& a,
                               size_t t0, float (*out)[kBlock]) {
  const size_t G = il.group_size, n_groups = il.cols / G, gps = kSuper / G, n_super = il.cols / kSuper;
  const size_t k_tile = std::min<size_t>(G, 64), steps = G / k_tile;
  const int8_t* x = &a.q[t0 * il.cols];
  const float* dx[kNT];
  const int16_t* sg[kNT];
  for (size_t t = 0; t < kNT; ++t) {
    dx[t] = &a.dx[(t0 + t) * n_super];
    sg[t] = &a.sums[(t0 + t) * n_groups];
  }
  __m512 acc1[kNT], acc2[kNT];
  for (size_t t = 0; t < kNT; ++t) acc1[t] = acc2[t] = _mm512_setzero_ps();
  alignas(64) int32_t dot[kNT][kBlock];
  for (size_t k = 0; k < n_super; ++k) {
    __m512i t1[kNT];
    for (size_t t = 0; t < kNT; ++t) t1[t] = _mm512_setzero_si512();
    for (size_t g = k * gps; g < (k + 1) * gps; ++g) {
      const size_t at = (block * n_groups + g) * kBlock;
      const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(&il.scales8[at])));
      dots(x, il.cols, b, g * G, k_tile, steps, dot);
      for (size_t t = 0; t < kNT; ++t) {
        __m512i d = _mm512_load_si512(dot[t]);
        if constexpr (!kAffine) d = _mm512_sub_epi32(d, _mm512_set1_epi32(8 * sg[t][g]));
        t1[t] = _mm512_add_epi32(t1[t], _mm512_mullo_epi32(d, s));
      }
    }
    for (size_t t = 0; t < kNT; ++t) acc1[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t1[t]), _mm512_set1_ps(dx[t][k]), acc1[t]);
    if constexpr (kAffine) {
      // T2 = sum_g n_g S_g: an exact integer, computed as the VNNI path does (any order gives it).
      __m512i n[kSuper / 32];
      for (size_t j = 0; j < gps; ++j) {
        const size_t at = (block * n_groups + k * gps + j) * kBlock;
        n[j] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(&il.mins8[at])));
      }
      for (size_t t = 0; t < kNT; ++t) {
        __m512i t2 = _mm512_setzero_si512();
        for (size_t j = 0; j < gps; ++j) {
          t2 = _mm512_add_epi32(t2, _mm512_mullo_epi32(n[j], _mm512_set1_epi32(sg[t][k * gps + j])));
        }
        acc2[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t2), _mm512_set1_ps(dx[t][k]), acc2[t]);
      }
    }
  }
  const __m512 row_d = _mm512_loadu_ps(&il.row_d[block * kBlock]);
  for (size_t t = 0; t < kNT; ++t) {
    if constexpr (kAffine) {
      const __m512 row_m = _mm512_loadu_ps(&il.row_m[block * kBlock]);
      _mm512_storeu_ps(out[t], _mm512_fmsub_ps(row_d, acc1[t], _mm512_mul_ps(row_m, acc2[t])));
    } else {
      _mm512_storeu_ps(out[t], _mm512_mul_ps(row_d, acc1[t]));
    }
  }
}

// Rows [row_begin, row_end) for tokens [0, n_tokens): each 16-row block's codes split once,
// then every 8-token tile over them; `tile(block, b, t0, out)` computes one.
template <typename Tile>
KESTREL_AMX_TARGET void each_block(const W4Int8Interleaved& il, size_t k_tile, size_t n_tokens, float* y,
                                   size_t y_stride, size_t row_begin, size_t row_end, Tile tile) {
  if (n_tokens % kNT != 0) throw Error("gemv_w4_amx: the token count is not a multiple of 8");
  uint8_t* b = scratch(il.cols * kBlock);
  configure(k_tile);
  float out[kNT][kBlock];
  for (size_t blk = row_begin / kBlock; blk * kBlock < row_end; ++blk) {
    const size_t lo = std::max(row_begin, blk * kBlock), hi = std::min(row_end, (blk + 1) * kBlock);
    split_nibbles(il, blk, b);
    for (size_t t0 = 0; t0 < n_tokens; t0 += kNT) {
      tile(blk, b, t0, out);
      for (size_t t = 0; t < kNT; ++t) {
        std::copy(&out[t][lo - blk * kBlock], &out[t][hi - blk * kBlock], y + (t0 + t) * y_stride + lo);
      }
    }
  }
  _tile_release();
}

#endif  // KESTREL_HAVE_AMX

}  // namespace

void w4_blocks_amx(const W4Int8Interleaved& il, const int8_t* xq, const float* xd, const float* xs, size_t n_tokens,
                   float* y, size_t y_stride, size_t row_begin, size_t row_end) {
#ifdef KESTREL_HAVE_AMX
  each_block(il, kXBlock, n_tokens, y, y_stride, row_begin, row_end,
             [&](size_t blk, const uint8_t* b, size_t t0, float (*out)[kBlock]) {
               if (il.params8()) return blocks8<true>(il, blk, b, xq, xd, xs, t0, out);
               blocks8<false>(il, blk, b, xq, xd, xs, t0, out);
             });
#else
  (void)il, (void)xq, (void)xd, (void)xs, (void)n_tokens, (void)y, (void)y_stride, (void)row_begin, (void)row_end;
  throw Error("gemv_w4_amx: built without AMX");
#endif
}

void w4_super_amx(const W4Int8Interleaved& il, const SuperActivations& a, size_t n_tokens, float* y, size_t y_stride,
                  size_t row_begin, size_t row_end) {
#ifdef KESTREL_HAVE_AMX
  each_block(il, std::min<size_t>(il.group_size, 64), n_tokens, y, y_stride, row_begin, row_end,
             [&](size_t blk, const uint8_t* b, size_t t0, float (*out)[kBlock]) {
               if (il.mins8.empty()) return super8<false>(il, blk, b, a, t0, out);
               super8<true>(il, blk, b, a, t0, out);
             });
#else
  (void)il, (void)a, (void)n_tokens, (void)y, (void)y_stride, (void)row_begin, (void)row_end;
  throw Error("gemv_w4_amx: built without AMX");
#endif
}

}  // namespace kestrel::kernels
