#include "kestrel/kernels/gemm_bf16.h"

#include <cstdlib>

#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/kernel_options.h"

#include "kestrel/kernels/x86_bf16.h"

namespace kestrel::kernels {

#ifdef KESTREL_HAVE_BF16_DOT
namespace {

KESTREL_BF16_TARGET inline __m512bh load_bh(const uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

// 4 rows x 4 tokens: 16 accumulators, 8 loads per 16 vdpbf16ps (512 multiply-adds).
KESTREL_BF16_TARGET void tile4x4(const uint16_t* const* w, const uint16_t* const* x, size_t cols,
                                 float out[4][4]) {
  __m512 acc[4][4];
  for (auto& row : acc) for (auto& a : row) a = _mm512_setzero_ps();
  for (size_t i = 0; i < cols; i += 32) {
    const __m512bh x0 = load_bh(x[0] + i), x1 = load_bh(x[1] + i), x2 = load_bh(x[2] + i),
                   x3 = load_bh(x[3] + i);
    for (int r = 0; r < 4; ++r) {
      const __m512bh wv = load_bh(w[r] + i);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], wv, x0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], wv, x1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], wv, x2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], wv, x3);
    }
  }
  for (int r = 0; r < 4; ++r) {
    for (int t = 0; t < 4; ++t) out[r][t] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

KESTREL_BF16_TARGET float dot(const uint16_t* w, const uint16_t* x, size_t cols) {
  __m512 acc = _mm512_setzero_ps();
  for (size_t i = 0; i < cols; i += 32) acc = _mm512_dpbf16_ps(acc, load_bh(w + i), load_bh(x + i));
  return _mm512_reduce_add_ps(acc);
}

KESTREL_BF16_TARGET void gemm(const uint16_t* w, size_t n_rows, size_t cols, const uint16_t* x,
                              size_t n_tokens, size_t x_stride, float* y, size_t y_stride,
                              size_t row0) {
  size_t t = 0;
  for (; t + 4 <= n_tokens; t += 4) {
    const uint16_t* xt[4] = {x + t * x_stride, x + (t + 1) * x_stride, x + (t + 2) * x_stride,
                             x + (t + 3) * x_stride};
    size_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
      const uint16_t* wr[4] = {w + r * cols, w + (r + 1) * cols, w + (r + 2) * cols, w + (r + 3) * cols};
      float out[4][4];
      tile4x4(wr, xt, cols, out);
      for (int k = 0; k < 4; ++k) {
        for (int j = 0; j < 4; ++j) y[(t + j) * y_stride + row0 + r + k] = out[k][j];
      }
    }
    for (; r < n_rows; ++r) {
      for (int j = 0; j < 4; ++j) y[(t + j) * y_stride + row0 + r] = dot(w + r * cols, xt[j], cols);
    }
  }
  for (; t < n_tokens; ++t) {
    for (size_t r = 0; r < n_rows; ++r) y[t * y_stride + row0 + r] = dot(w + r * cols, x + t * x_stride, cols);
  }
}

KESTREL_BF16_TARGET void convert(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(in + i + 16), _mm512_loadu_ps(in + i));
    _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(v));
  }
  for (; i < n; ++i) out[i] = gguf::fp32_to_bf16(in[i]);
}

}  // namespace
#endif  // KESTREL_HAVE_BF16_DOT

bool bf16_dot_available() {
#ifdef KESTREL_HAVE_BF16_DOT
  static const bool cpu = __builtin_cpu_supports("avx512bf16");
  return cpu && kernel_options().bf16_dot;
#else
  return false;
#endif
}

void gemm_bf16_block(const uint16_t* w, size_t n_rows, size_t cols, const uint16_t* x,
                     size_t n_tokens, size_t x_stride, float* y, size_t y_stride, size_t row0) {
#ifdef KESTREL_HAVE_BF16_DOT
  gemm(w, n_rows, cols, x, n_tokens, x_stride, y, y_stride, row0);
#else
  (void)w, (void)n_rows, (void)cols, (void)x, (void)n_tokens, (void)x_stride, (void)y,
      (void)y_stride, (void)row0;
#endif
}

void to_bf16(const float* in, uint16_t* out, size_t n) {
#ifdef KESTREL_HAVE_BF16_DOT
  if (bf16_dot_available()) return convert(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = gguf::fp32_to_bf16(in[i]);
}

}  // namespace kestrel::kernels
