#include "kestrel/kernels/gemv_q8_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KESTREL_HAVE_AVX2_PATH 1
#define KESTREL_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#endif

namespace kestrel::kernels {
namespace {

constexpr size_t kQ8 = 32;       // columns per Q8_0 block
constexpr size_t kQ8Bytes = 34;  // fp16 scale + 32 int8 codes
constexpr size_t kRows = 8;      // rows per AVX2 pass (one float32 lane each)
// From this many tokens a product on AVX512-VNNI copies each 16 rows to the interleaved layout
// and runs gemv_q8_interleaved's tiles (the break-even on a 2-core Intel Xeon with AVX512-VNNI
// and AMX, session 29: kestrel_kernels_bench Batch/Q8_0Int8Rows).
constexpr size_t kInterleaveTokens = 8;

// One row for one token: q and xd are the token's int8 activations and block scales.
float row_token(const uint8_t* row, size_t nb, const int8_t* q, const float* xd) {
  float acc = 0.0f;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* block = row + b * kQ8Bytes;
    uint16_t half = 0;
    std::memcpy(&half, block, sizeof(half));
    const auto* w = reinterpret_cast<const int8_t*>(block + 2);
    int32_t dot = 0;
    for (size_t i = 0; i < kQ8; ++i) dot += static_cast<int32_t>(w[i]) * q[b * kQ8 + i];
    acc = std::fma(static_cast<float>(dot), gguf::fp16_to_fp32(half) * xd[b], acc);
  }
  return acc;
}

#ifdef KESTREL_HAVE_AVX2_PATH

// The 8 int32 sums of 8 rows' vectors (lane i of the result: the sum of dot[i]'s lanes): hadd
// pairs within 128-bit halves, after two rounds the low half holds rows 0-3's (then 4-7's) sums
// of lanes 0-3, the high half those of lanes 4-7; the halves added give each sum.
KESTREL_AVX2_TARGET inline __m256i row_sums8_avx2(const __m256i (&dot)[8]) {
  const __m256i h01 = _mm256_hadd_epi32(dot[0], dot[1]), h23 = _mm256_hadd_epi32(dot[2], dot[3]);
  const __m256i h45 = _mm256_hadd_epi32(dot[4], dot[5]), h67 = _mm256_hadd_epi32(dot[6], dot[7]);
  const __m256i h0123 = _mm256_hadd_epi32(h01, h23), h4567 = _mm256_hadd_epi32(h45, h67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

// Rows row0 .. row0 + 7 (row_bytes apart) for one token into out[0..8). Per block: each row's
// 32 products summed to 8 int32 (|w| x sign(q, w) pairs, at most 2 * 128 * 127 < 2^15, then
// vpmaddwd by ones), the 8 rows' vectors reduced to one of their 8 sums (lane = row), then the
// interleaved kernel's float32 steps.
// `ahead` (null: none): the next rows' bytes, requested a few cache lines per block so that
// the next pass finds them in cache (the 8 rows read side by side are 8 interleaved streams,
// which the hardware prefetcher follows poorly: the dense head read 11 of this machine's 24 GB/s).
KESTREL_AVX2_TARGET void rows8_avx2(const uint8_t* row0, size_t row_bytes, size_t nb, const int8_t* q,
                                    const float* xd, float* out, const uint8_t* ahead) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  const size_t lines = ahead != nullptr ? (kRows * row_bytes + 63) / 64 : 0;
  const size_t lines_per_block = (lines + nb - 1) / nb;
  for (size_t b = 0; b < nb; ++b) {
    for (size_t l = b * lines_per_block; l < std::min(lines, (b + 1) * lines_per_block); ++l) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * l), _MM_HINT_T0);
    }
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b * kQ8));
    __m256i dot[kRows];
    alignas(16) uint16_t halves[kRows];
    for (size_t r = 0; r < kRows; ++r) {
      const uint8_t* block = row0 + r * row_bytes + b * kQ8Bytes;
      std::memcpy(&halves[r], block, sizeof(uint16_t));
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
      dot[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)), ones);
    }
    const __m256i sums = row_sums8_avx2(dot);
    const __m256 s = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(halves)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(s, _mm256_set1_ps(xd[b])), acc);
  }
  _mm256_storeu_ps(out, acc);
}

// rows8_avx2 for NT tokens (1..kRowsTokensMax) at once: each block's 8 fp16 scales widened
// once for all of them and its rows read from L1 per token; per token the same integer sums
// and float32 steps as rows8_avx2 (the same bits).
template <size_t NT>
KESTREL_AVX2_TARGET void rows8_tokens_avx2(const uint8_t* row0, size_t row_bytes, size_t nb, const int8_t* const* q,
                                           const float* const* xd, float* const* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NT];
  for (size_t t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    alignas(16) uint16_t halves[kRows];
    for (size_t r = 0; r < kRows; ++r) std::memcpy(&halves[r], row0 + r * row_bytes + b * kQ8Bytes, sizeof(uint16_t));
    const __m256 s = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(halves)));
    for (size_t t = 0; t < NT; ++t) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[t] + b * kQ8));
      __m256i dot[kRows];
      for (size_t r = 0; r < kRows; ++r) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row0 + r * row_bytes + b * kQ8Bytes + 2));
        dot[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)), ones);
      }
      const __m256i sums = row_sums8_avx2(dot);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(s, _mm256_set1_ps(xd[t][b])), acc[t]);
    }
  }
  for (size_t t = 0; t < NT; ++t) _mm256_storeu_ps(out[t], acc[t]);
}

#endif  // KESTREL_HAVE_AVX2_PATH

void check(const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end, size_t row_begin,
           size_t row_end) {
  if (w.type != WeightType::kQ8_0) throw Error("gemv_q8_rows: not a Q8_0 matrix");
  if (x.cols != w.cols || w.cols % kQ8 != 0) {
    throw Error("gemv_q8_rows: activations of " + std::to_string(x.cols) + " columns for a matrix of " +
                std::to_string(w.cols));
  }
  if (row_begin > row_end || row_end > w.rows) throw Error("gemv_q8_rows: rows past the matrix");
  if (t_begin > t_end || t_end > x.n_tokens) throw Error("gemv_q8_rows: tokens past the activations");
}

}  // namespace

void gemv_q8_rows(const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end, float* y,
                  size_t y_stride, size_t row_begin, size_t row_end) {
  gemv_q8_rows_on(best_int8_isa(), w, x, t_begin, t_end, y, y_stride, row_begin, row_end);
}

void gemv_q8_rows_on(Int8Isa isa, const Matrix& w, const Q8Activations& x, size_t t_begin, size_t t_end,
                     float* y, size_t y_stride, size_t row_begin, size_t row_end) {
  if (!int8_isa_available(isa)) throw Error(std::string("gemv_q8_rows: ") + int8_isa_name(isa) + " is not available");
  check(w, x, t_begin, t_end, row_begin, row_end);
  const size_t nb = w.cols / kQ8;
  auto token = [&](size_t t) { return std::make_tuple(&x.q[t * x.cols], &x.scale[t * nb], y + (t - t_begin) * y_stride); };
  size_t r = row_begin;
  if (isa == Int8Isa::kAvx512Vnni && t_end - t_begin >= kInterleaveTokens) {
    // Many tokens: 16 rows at a time interleaved on the fly, then vpdpbusd tiles (the same bits).
    for (; r + 16 <= row_end; r += 16) gemv_q8_rows_block16_vnni(w, r, x, t_begin, t_end, y + r, y_stride);
  }
#ifdef KESTREL_HAVE_AVX2_PATH
  if (isa != Int8Isa::kPortable) {  // AVX2, or AVX512-VNNI (whose CPUs all have AVX2)
    // Rows outer, tokens inner: 8 rows (5.4 KB for d_model 640) stay in L1 while every token
    // reads them, instead of the whole range streaming past once per token (a 64-token chunk
    // of the 262,144-row head read the head 64 times).
    for (; r + kRows <= row_end; r += kRows) {
      const uint8_t* ahead = r + 2 * kRows <= row_end ? w.row(r + kRows) : nullptr;
      for (size_t t = t_begin; t < t_end; ++t) {
        const auto [q, xd, yt] = token(t);
        rows8_avx2(w.row(r), w.row_bytes(), nb, q, xd, yt + r, t == t_begin ? ahead : nullptr);
      }
    }
  }
#endif
  for (; r < row_end; ++r) {
    for (size_t t = t_begin; t < t_end; ++t) {
      const auto [q, xd, yt] = token(t);
      yt[r] = row_token(w.row(r), nb, q, xd);
    }
  }
}

void gemv_q8_rows_tokens(const Matrix& w, const Q8Activations& x, std::span<const size_t> tokens,
                         std::span<float* const> ys, size_t row_begin, size_t row_end) {
  gemv_q8_rows_tokens_on(best_int8_isa(), w, x, tokens, ys, row_begin, row_end);
}

void gemv_q8_rows_tokens_on(Int8Isa isa, const Matrix& w, const Q8Activations& x, std::span<const size_t> tokens,
                            std::span<float* const> ys, size_t row_begin, size_t row_end) {
  if (!int8_isa_available(isa)) {
    throw Error(std::string("gemv_q8_rows_tokens: ") + int8_isa_name(isa) + " is not available");
  }
  if (tokens.empty() || tokens.size() > kRowsTokensMax || ys.size() != tokens.size()) {
    throw Error("gemv_q8_rows_tokens: 1 to " + std::to_string(kRowsTokensMax) + " tokens, one output each");
  }
  for (size_t t : tokens) check(w, x, t, t + 1, row_begin, row_end);
  const size_t nb = w.cols / kQ8;
  size_t r = row_begin;
#ifdef KESTREL_HAVE_AVX2_PATH
  if (isa != Int8Isa::kPortable) {
    const int8_t* q[kRowsTokensMax];
    const float* xd[kRowsTokensMax];
    float* out[kRowsTokensMax];
    for (size_t i = 0; i < tokens.size(); ++i) q[i] = &x.q[tokens[i] * x.cols], xd[i] = &x.scale[tokens[i] * nb];
    for (; r + kRows <= row_end; r += kRows) {
      for (size_t i = 0; i < tokens.size(); ++i) out[i] = ys[i] + (r - row_begin);
      switch (tokens.size()) {
        case 4: rows8_tokens_avx2<4>(w.row(r), w.row_bytes(), nb, q, xd, out); break;
        case 3: rows8_tokens_avx2<3>(w.row(r), w.row_bytes(), nb, q, xd, out); break;
        case 2: rows8_tokens_avx2<2>(w.row(r), w.row_bytes(), nb, q, xd, out); break;
        default: rows8_tokens_avx2<1>(w.row(r), w.row_bytes(), nb, q, xd, out); break;
      }
    }
  }
#endif
  for (; r < row_end; ++r) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      ys[i][r - row_begin] = row_token(w.row(r), nb, &x.q[tokens[i] * x.cols], &x.scale[tokens[i] * nb]);
    }
  }
}

}  // namespace kestrel::kernels
