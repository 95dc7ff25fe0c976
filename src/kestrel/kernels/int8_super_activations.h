// Activations rounded to int8 per superblock of 128 columns: shared by the INT4 superblock
// kernels (gemv_w4_int8.h, "Superblocks") and the W8A8 prefill kernels (gemm_w8a8.h).
// Per token t and superblock k: d_xk = max|x| / 127 (float32, an IEEE division),
// xq_i = round-to-nearest-even(x_i / d_xk) clamped to [-127, 127] (0 where d_xk = 0), and per
// group g of G columns S_g = sum_{i in g} xq_i. Every path (AVX-512, AVX2, portable) gives the
// same numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kestrel/kernels/int8_isa.h"

namespace kestrel::kernels {

inline constexpr size_t kSuper = 128;  // columns per activation superblock

/// One call's activations: int8 values, per token and superblock d_xk, per token and group
/// S_g (one int16 of padding at the end: the pair loads of gemv_w4_int8 read S_g and S_g+1).
struct SuperActivations {
  std::vector<int8_t> q;      // [n_tokens][cols]
  std::vector<float> dx;      // [n_tokens][cols / 128]
  std::vector<int16_t> sums;  // [n_tokens][cols / G] + 1; |S_g| <= 127 G (G <= 128: int16)
};

/// Quantizes x[t * x_stride + i] (float32, t < n_tokens, i < cols) into `a` on the path of
/// `isa` (cols a multiple of 128, G a multiple of 32 dividing 128).
void quantize_super_on(Int8Isa isa, const float* x, size_t n_tokens, size_t x_stride, size_t cols, size_t G,
                       SuperActivations& a);

/// Tokens t0 .. t0 + NT of `a` (cols columns, groups of G): pointers to their int8 values, d_xk and
/// group sums S_g, for the kernels' token tiles.
template <size_t NT>
struct SuperTokens {
  const int8_t* q[NT];
  const float* dx[NT];
  const int16_t* sums[NT];
  SuperTokens(const SuperActivations& a, size_t t0, size_t cols, size_t G) {
    for (size_t t = 0; t < NT; ++t) {
      q[t] = &a.q[(t0 + t) * cols];
      dx[t] = &a.dx[(t0 + t) * (cols / kSuper)];
      sums[t] = &a.sums[(t0 + t) * (cols / G)];
    }
  }
};

}  // namespace kestrel::kernels
