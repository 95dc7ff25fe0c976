#include "kestrel/kernels/gemv_w4_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemv_q8_rows.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KESTREL_HAVE_AVX2_PATH 1
#define KESTREL_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#endif

namespace kestrel::kernels {
namespace {

constexpr size_t kXBlock = 32;  // columns per activation block

// Code of column c of a row (matmul.h: a group's byte j holds weight j low, j + G/2 high).
inline int32_t code(const uint8_t* row, size_t c, size_t group_size) {
  const size_t g = c / group_size, j = c % group_size, half = group_size / 2;
  const uint8_t byte = row[g * half + j % half];
  return j < half ? byte & 0x0F : byte >> 4;
}

// One row for one token (the portable path).
float row_token(const Matrix& w, size_t r, const int8_t* q, const float* xd, const int32_t* sum128) {
  const size_t G = w.group_size, n_groups = w.cols / G, nb = w.cols / kXBlock;
  const uint8_t* row = w.row(r);
  thread_local std::vector<float> d, m;  // the row's group parameters (w4_group_params: gemv_w4_int8's)
  d.resize(n_groups);
  m.resize(n_groups);
  w4_group_params(w, r, d.data(), m.data());
  float acc = 0.0f, macc = 0.0f;
  for (size_t b = 0; b < nb; ++b) {
    const size_t g = b * kXBlock / G;
    int32_t dot = 0;
    for (size_t c = b * kXBlock; c < (b + 1) * kXBlock; ++c) dot += code(row, c, G) * q[c];
    acc = std::fma(static_cast<float>(dot), d[g] * xd[b], acc);
    macc = std::fma(m[g], static_cast<float>(sum128[b] / 128) * xd[b], macc);
  }
  return acc + macc;
}

#ifdef KESTREL_HAVE_AVX2_PATH

constexpr size_t kRows = 8;  // rows per pass (one float32 lane each)

// Block k of a group as 32 unsigned bytes, column order: groups of 32 are one 16-byte run (low
// nibbles, then high); larger groups take the low nibbles of 32 bytes for their first half of
// blocks and the high nibbles of the same bytes for the second.
KESTREL_AVX2_TARGET inline __m256i block_codes(const uint8_t* group, size_t k, size_t blocks_per_group) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  if (blocks_per_group == 1) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(group));
    const __m128i lo = _mm_and_si128(bytes, _mm256_castsi256_si128(low));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm256_castsi256_si128(low));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  }
  const size_t half = blocks_per_group / 2;
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + kXBlock * (k % half)));
  return k < half ? _mm256_and_si256(bytes, low) : _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
}

// Rows r0 .. r0 + 7's group parameters, d and m per group as 8 lanes (lane = row), into
// d[g * 8 ..] and m[g * 8 ..]: w4_group_params' float32 numbers, with the hardware's fp16
// conversion (exact either way) and once per pass, not per token.
// 8 rows' fp16 values base[(r0 + i) * stride] as float32 lanes.
KESTREL_AVX2_TARGET inline __m256 halves8(const uint16_t* base, size_t r0, size_t stride) {
  alignas(16) uint16_t h[kRows];
  for (size_t i = 0; i < kRows; ++i) h[i] = base[(r0 + i) * stride];
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
}

// 8 rows' bytes base[(r0 + i) * stride] as float32 lanes.
KESTREL_AVX2_TARGET inline __m256 bytes8(const uint8_t* base, size_t r0, size_t stride) {
  alignas(16) uint8_t b[16] = {};
  for (size_t i = 0; i < kRows; ++i) b[i] = base[(r0 + i) * stride];
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b))));
}

KESTREL_AVX2_TARGET void pass_params(const Matrix& w, size_t r0, float* d, float* m) {
  const size_t n_groups = w.cols / w.group_size;
  const __m256 minus8 = _mm256_set1_ps(-8.0f);
  if (w.scales8 != nullptr) {
    const __m256 row_d = halves8(w.row_scales, r0, 2);
    const __m256 neg_row_m = _mm256_xor_ps(halves8(w.row_scales + 1, r0, 2), _mm256_set1_ps(-0.0f));
    for (size_t g = 0; g < n_groups; ++g) {
      const __m256 dg = _mm256_mul_ps(row_d, bytes8(w.scales8 + g, r0, n_groups));
      _mm256_storeu_ps(d + g * kRows, dg);
      _mm256_storeu_ps(m + g * kRows, w.mins8 == nullptr ? _mm256_mul_ps(dg, minus8)
                                                        : _mm256_mul_ps(neg_row_m, bytes8(w.mins8 + g, r0, n_groups)));
    }
    return;
  }
  for (size_t g = 0; g < n_groups; ++g) {
    const __m256 dg = halves8(w.scales + g, r0, n_groups);
    _mm256_storeu_ps(d + g * kRows, dg);
    _mm256_storeu_ps(m + g * kRows, w.mins == nullptr ? _mm256_mul_ps(dg, minus8) : halves8(w.mins + g, r0, n_groups));
  }
}

// Rows r0 .. r0 + 7 for one token into out[0..8), with their parameters from pass_params.
// `ahead` (null: none): the next pass's rows, whose lines are requested a few per block (8 rows
// side by side are 8 streams, which the hardware prefetcher follows poorly).
KESTREL_AVX2_TARGET void rows8_avx2(const Matrix& w, size_t r0, const float* pd, const float* pm, const int8_t* q,
                                    const float* xd, const int32_t* sum128, float* out, const uint8_t* ahead) {
  const size_t G = w.group_size, n_groups = w.cols / G, blocks_per_group = G / kXBlock, nb = w.cols / kXBlock;
  const size_t row_bytes = w.row_bytes();
  const size_t lines = ahead != nullptr ? (kRows * row_bytes + 63) / 64 : 0;
  const size_t lines_per_block = (lines + nb - 1) / nb;
  const uint8_t* rows[kRows];
  for (size_t i = 0; i < kRows; ++i) rows[i] = w.row(r0 + i);
  __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
  for (size_t g = 0; g < n_groups; ++g) {
    const __m256 d = _mm256_loadu_ps(pd + g * kRows), m = _mm256_loadu_ps(pm + g * kRows);
    for (size_t k = 0; k < blocks_per_group; ++k) {
      const size_t b = g * blocks_per_group + k;
      for (size_t l = b * lines_per_block; l < std::min(lines, (b + 1) * lines_per_block); ++l) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * l), _MM_HINT_T0);
      }
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b * kXBlock));
      __m256i p[kRows];
      for (size_t i = 0; i < kRows; ++i) {
        p[i] = _mm256_maddubs_epi16(block_codes(rows[i] + g * (G / 2), k, blocks_per_group), x);
      }
      // Pairs added within 128-bit halves: after three rounds the low half holds each row's sum
      // over columns 0-15 (lane = row), the high half over 16-31.
      const __m256i h01 = _mm256_hadd_epi16(p[0], p[1]), h23 = _mm256_hadd_epi16(p[2], p[3]);
      const __m256i h45 = _mm256_hadd_epi16(p[4], p[5]), h67 = _mm256_hadd_epi16(p[6], p[7]);
      const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(h01, h23), _mm256_hadd_epi16(h45, h67));
      const __m256i dot = _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(h)),
                                           _mm256_cvtepi16_epi32(_mm256_extracti128_si256(h, 1)));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(xd[b])), acc);
      const float sx = static_cast<float>(sum128[b] / 128) * xd[b];
      macc = _mm256_fmadd_ps(m, _mm256_set1_ps(sx), macc);
    }
  }
  _mm256_storeu_ps(out, _mm256_add_ps(acc, macc));
}

#endif  // KESTREL_HAVE_AVX2_PATH

void check(const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end, size_t row_begin,
           size_t row_end) {
  if (!w4_rows_supported(w)) throw Error("gemv_w4_rows: not an INT4 matrix with groups a multiple of 32");
  if (x.cols != w.cols) {
    throw Error("gemv_w4_rows: activations of " + std::to_string(x.cols) + " columns for a matrix of " +
                std::to_string(w.cols));
  }
  if (row_begin > row_end || row_end > w.rows) throw Error("gemv_w4_rows: rows past the matrix");
  if (t_begin > t_end || t_end > x.n_tokens) throw Error("gemv_w4_rows: tokens past the activations");
}

}  // namespace

bool w4_rows_supported(const Matrix& w) {
  const bool params = w.scales != nullptr || (w.scales8 != nullptr && w.row_scales != nullptr);
  return w.type == WeightType::kW4 && params && w.group_size > 0 && w.group_size % kXBlock == 0 &&
         w.cols % w.group_size == 0;
}

void gemv_w4_rows(const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end, float* y,
                  size_t y_stride, size_t row_begin, size_t row_end) {
  gemv_w4_rows_on(best_int8_isa(), w, x, t_begin, t_end, y, y_stride, row_begin, row_end);
}

void gemv_int8_rows(const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end, float* y,
                    size_t y_stride, size_t row_begin, size_t row_end) {
  if (w.type == WeightType::kQ8_0) return gemv_q8_rows(w, x, t_begin, t_end, y, y_stride, row_begin, row_end);
  if (w.type == WeightType::kW4) return gemv_w4_rows(w, x, t_begin, t_end, y, y_stride, row_begin, row_end);
  throw Error("gemv_int8_rows: the rows kernels take Q8_0 and INT4 matrices only");
}

void gemv_w4_rows_on(Int8Isa isa, const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end,
                     float* y, size_t y_stride, size_t row_begin, size_t row_end) {
  if (!int8_isa_available(isa)) throw Error(std::string("gemv_w4_rows: ") + int8_isa_name(isa) + " is not available");
  check(w, x, t_begin, t_end, row_begin, row_end);
  const size_t nb = w.cols / kXBlock;
  auto token = [&](size_t t) { return std::make_tuple(&x.q[t * x.cols], &x.scale[t * nb], &x.sum128[t * nb]); };
  size_t r = row_begin;
#ifdef KESTREL_HAVE_AVX2_PATH
  if (isa != Int8Isa::kPortable) {  // AVX2, or AVX512-VNNI (whose CPUs all have AVX2)
    thread_local std::vector<float> pd, pm;
    const size_t n_params = w.cols / w.group_size * kRows;
    if (pd.size() < n_params) pd.resize(n_params), pm.resize(n_params);
    for (; r + kRows <= row_end; r += kRows) {
      const uint8_t* ahead = r + 2 * kRows <= row_end ? w.row(r + kRows) : nullptr;
      pass_params(w, r, pd.data(), pm.data());
      for (size_t t = t_begin; t < t_end; ++t) {
        const auto [q, xd, sum128] = token(t);
        rows8_avx2(w, r, pd.data(), pm.data(), q, xd, sum128, y + (t - t_begin) * y_stride + r,
                   t == t_begin ? ahead : nullptr);
      }
    }
  }
#endif
  for (; r < row_end; ++r) {
    for (size_t t = t_begin; t < t_end; ++t) {
      const auto [q, xd, sum128] = token(t);
      y[(t - t_begin) * y_stride + r] = row_token(w, r, q, xd, sum128);
    }
  }
}

}  // namespace kestrel::kernels
