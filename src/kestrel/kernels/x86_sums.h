// Horizontal sums of 16 AVX-512 float vectors at once, shared by the float32 attention tiles
// (ops.cpp) and the bfloat16 ones (attention_bf16.cpp). Include only from kernel .cpp files;
// defines KESTREL_HAVE_SUMS_OF_16 where the compiler can emit AVX-512 (x86-64 GCC / Clang).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 warns inside its own avx512fintrin.h (the shuffles, _mm512_castps512_ps128) about an
// operand it deliberately leaves undefined (as x86_bf16.h).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define KESTREL_HAVE_SUMS_OF_16 1

namespace kestrel::kernels {

/// The 16 sums of 16 vectors of 16 floats in one vector, each by the tree of
/// _mm512_reduce_add_ps (what Highway's SumOfLanes compiles to: upper half onto lower half at
/// 256, 128, 64 and 32 bits), so a sum has the same bits as reducing its vector alone. 45
/// shuffles and adds, against 16 x 8 for the vectors one by one. 128-bit lane l of the result
/// holds the sums of v[l], v[4 + l], v[8 + l], v[12 + l] in that order.
__attribute__((target("avx512f"))) inline __m512 sums_of_16(const __m512* v) {
  __m512 h[8], w[4], x[2];
  for (int i = 0; i < 8; ++i) {  // [v.lo256 + v.hi256 | v'.lo256 + v'.hi256]
    h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit lane j: vector 4i + j, its lo128 + hi128
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {  // per lane [a0 + a2, a1 + a3, b0 + b2, b1 + b3]
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], 0xEE));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88), _mm512_shuffle_ps(x[0], x[1], 0xDD));
}

}  // namespace kestrel::kernels
#endif
