#include "kestrel/kernels/gemm_w4_amx_bf16.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/kernels/int8_isa.h"
#include "kestrel/kernels/kernel_options.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 intrinsics start from a self-initialized "undefined" vector.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define KESTREL_HAVE_AMX_BF16 1
#define KESTREL_AMX_BF16_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,f16c,fma")))
#endif

namespace kestrel::kernels {
namespace {

constexpr size_t kBlock = 16;  // rows per interleaved block, and tokens per tile
constexpr size_t kStep = 32;   // columns per tdpbf16ps

// Growable 64-byte aligned scratch, one per thread and use.
template <int kUse>
uint8_t* scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < bytes + 64) buffer.resize(bytes + 64);
  const auto at = reinterpret_cast<uintptr_t>(buffer.data());
  return buffer.data() + ((64 - at % 64) % 64);
}

#ifdef KESTREL_HAVE_AMX_BF16

// LDTILECFG's 64 bytes (Intel SDM vol. 2, "LDTILECFG"): palette 1, per tile its rows and bytes
// per row; here all eight 16 x 64 bytes (tmm0-3 the float32 sums, tmm4, 5 the tokens' bf16,
// tmm6, 7 the weights' column pairs).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

KESTREL_AMX_BF16_TARGET void configure() {
  TileConfig c;
  for (size_t i = 0; i < 8; ++i) {
    c.rows[i] = kBlock;
    c.colsb[i] = 64;
  }
  _tile_loadconfig(&c);
}

KESTREL_AMX_BF16_TARGET inline __m512 u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// 32-bit lane i: bf16(a_i) in the low half, bf16(b_i) in the high (round to nearest even).
KESTREL_AMX_BF16_TARGET inline __m512i pair(__m512 a, __m512 b) {
  const __m512i lo = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(a)));
  const __m512i hi = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(b)));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

// Block `block`'s weights as tile-B rows into out: [cols / 2][16] 32-bit lanes, row p lane i
// holding row i's (w[2p], w[2p + 1]) in bf16, w = fma(q, d, m) in float32.
KESTREL_AMX_BF16_TARGET void dequantize_block(const W4Int8Interleaved& il, size_t block, uint32_t* out) {
  const size_t G = il.group_size, n_groups = il.cols / G;
  const uint8_t* codes = &il.codes[block * (il.cols / 8) * 64];
  const __m512i nibbles = _mm512_set1_epi32(0x0F0F0F0F), byte = _mm512_set1_epi32(0xFF);
  __m512 row_d = _mm512_setzero_ps(), neg_row_m = _mm512_setzero_ps();
  if (il.params8()) {
    row_d = _mm512_loadu_ps(&il.row_d[block * kBlock]);
    neg_row_m = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(&il.row_m[block * kBlock]));
  }
  for (size_t g = 0; g < n_groups; ++g) {
    const size_t at = (block * n_groups + g) * kBlock;
    __m512 d, m;
    if (il.params8()) {
      d = _mm512_mul_ps(row_d, u8(&il.scales8[at]));
      m = il.mins8.empty() ? _mm512_mul_ps(d, _mm512_set1_ps(-8.0f)) : _mm512_mul_ps(neg_row_m, u8(&il.mins8[at]));
    } else {
      d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&il.scales[at])));
      m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&il.mins[at])));
    }
    for (size_t o = g * G / 8; o < (g + 1) * G / 8; ++o) {
      const __m512i bytes = _mm512_loadu_si512(codes + 64 * o);
      // Low nibbles: columns 8o .. 8o + 3 (byte j of lane i); high nibbles: 8o + 4 .. 8o + 7.
      for (size_t h = 0; h < 2; ++h) {
        const __m512i v = _mm512_and_si512(h == 0 ? bytes : _mm512_srli_epi32(bytes, 4), nibbles);
        __m512 w[4];
        for (int j = 0; j < 4; ++j) {
          const __m512i q = _mm512_and_si512(_mm512_srli_epi32(v, 8 * j), byte);
          w[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, m);
        }
        uint32_t* row = out + (4 * o + 2 * h) * kBlock;
        _mm512_store_si512(row, pair(w[0], w[1]));
        _mm512_store_si512(row + kBlock, pair(w[2], w[3]));
      }
    }
  }
}

// x's n_tokens rows as bf16 into out [n_padded][cols] (round to nearest even), rows past
// n_tokens zero.
KESTREL_AMX_BF16_TARGET void activations_bf16(const float* x, size_t n_tokens, size_t x_stride, size_t cols,
                                              size_t n_padded, uint16_t* out) {
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t c = 0; c < cols; c += 16) {
      const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + t * x_stride + c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t * cols + c), reinterpret_cast<__m256i>(b));
    }
  }
  std::memset(out + n_tokens * cols, 0, (n_padded - n_tokens) * cols * sizeof(uint16_t));
}

// Two row blocks (weights w0, w1) times two token tiles (bf16 rows x0, x1, `cols` apart), or
// one (x1 null): the float32 sums into sums[token][row] (rows 0-15 from w0, 16-31 from w1).
KESTREL_AMX_BF16_TARGET void tiles(const uint16_t* x0, const uint16_t* x1, const uint32_t* w0, const uint32_t* w1,
                                   size_t cols, float (*sums)[2 * kBlock]) {
  const size_t stride = cols * sizeof(uint16_t);
  constexpr size_t kOut = 2 * kBlock * sizeof(float);
  _tile_zero(0);
  _tile_zero(1);
  if (x1 == nullptr) {
    for (size_t c = 0; c < cols; c += kStep) {
      _tile_loadd(4, x0 + c, stride);
      _tile_loadd(6, w0 + c / 2 * kBlock, 64);
      _tile_loadd(7, w1 + c / 2 * kBlock, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
    }
  } else {
    _tile_zero(2);
    _tile_zero(3);
    for (size_t c = 0; c < cols; c += kStep) {
      _tile_loadd(4, x0 + c, stride);
      _tile_loadd(5, x1 + c, stride);
      _tile_loadd(6, w0 + c / 2 * kBlock, 64);
      _tile_loadd(7, w1 + c / 2 * kBlock, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(2, &sums[kBlock][0], kOut);
    _tile_stored(3, &sums[kBlock][kBlock], kOut);
  }
  _tile_stored(0, &sums[0][0], kOut);
  _tile_stored(1, &sums[0][kBlock], kOut);
}

KESTREL_AMX_BF16_TARGET void run(const W4Int8Interleaved& il, const float* x, size_t n_tokens, size_t x_stride,
                                 float* y, size_t y_stride, size_t row_begin, size_t row_end) {
  const size_t cols = il.cols, n_padded = (n_tokens + kBlock - 1) / kBlock * kBlock;
  auto* xb = reinterpret_cast<uint16_t*>(scratch<0>(n_padded * cols * sizeof(uint16_t)));
  activations_bf16(x, n_tokens, x_stride, cols, n_padded, xb);
  auto* wb = reinterpret_cast<uint32_t*>(scratch<1>(2 * kBlock * cols * sizeof(uint16_t)));
  uint32_t* w0 = wb;
  uint32_t* w1 = wb + cols / 2 * kBlock;
  // The dequantized weights are plain stores; the tile loads are asm statements that name only
  // their addresses: the barrier keeps the compiler from sinking the stores past them.
  configure();
  alignas(64) float sums[2 * kBlock][2 * kBlock];
  const size_t first = row_begin / kBlock, last = (row_end + kBlock - 1) / kBlock;  // blocks [first, last)
  for (size_t blk = first; blk < last; blk += 2) {
    const bool two = blk + 1 < last;
    dequantize_block(il, blk, w0);
    if (two) dequantize_block(il, blk + 1, w1);
    __asm__ volatile("" ::: "memory");
    for (size_t t0 = 0; t0 < n_tokens; t0 += 2 * kBlock) {
      const uint16_t* x1 = t0 + kBlock < n_padded ? xb + (t0 + kBlock) * cols : nullptr;
      tiles(xb + t0 * cols, x1, w0, two ? w1 : w0, cols, sums);
      __asm__ volatile("" ::: "memory");
      const size_t lo = std::max(row_begin, blk * kBlock), hi = std::min(row_end, (blk + (two ? 2 : 1)) * kBlock);
      for (size_t t = t0; t < std::min(n_tokens, t0 + 2 * kBlock); ++t) {
        std::copy(&sums[t - t0][lo - blk * kBlock], &sums[t - t0][hi - blk * kBlock], y + t * y_stride + lo);
      }
    }
  }
  _tile_release();
}

#endif  // KESTREL_HAVE_AMX_BF16

}  // namespace

bool amx_bf16_available() {
#ifdef KESTREL_HAVE_AMX_BF16
  static const bool on = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && amx_bf16_cpu() && amx_tiles_granted();
  return on;
#else
  return false;
#endif
}

bool amx_prefill_enabled() {
  return kernel_options().amx && amx_bf16_available();
}

void gemm_w4_amx_bf16(const W4Int8Interleaved& il, const float* x, size_t n_tokens, size_t x_stride, float* y,
                      size_t y_stride, size_t row_begin, size_t row_end) {
  if (row_end > il.rows || row_begin > row_end) throw Error("gemm_w4_amx_bf16: rows past the matrix");
  if (!amx_bf16_available()) throw Error("gemm_w4_amx_bf16: AMX-BF16 is not available");
  if (n_tokens == 0 || row_begin == row_end) return;
#ifdef KESTREL_HAVE_AMX_BF16
  run(il, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
#else
  (void)x, (void)x_stride, (void)y, (void)y_stride;
#endif
}

}  // namespace kestrel::kernels
