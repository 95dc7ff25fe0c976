#include "kestrel/kernels/gemm_w8a8.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/kernels/kernel_options.h"
#include "kestrel/kernels/x86_int8_targets.h"

namespace kestrel::kernels {
namespace {

constexpr size_t kBlock = 16;  // rows per interleaved block
constexpr size_t kQuads = kSuper / 4;
// Superblocks per pass over a block's weights (16 rows x 2,048 columns, 32 KiB) before the next
// token tile: E4B-shaped prefill 8: 232 tok/s, 16: 258-272, whole rows (up to 80): 253-258.
constexpr size_t kChunk = 16;

size_t weight_byte(size_t i, size_t c) { return (c / 4) * 64 + 4 * i + c % 4; }

// The portable path: the header's formula, row by row.
void scalar(const W4Int8Interleaved& il, const SuperActivations& a, size_t n_tokens, float* y, size_t y_stride,
            size_t row_begin, size_t row_end) {
  const size_t n_super = il.cols / kSuper;
  for (size_t r = row_begin; r < row_end; ++r) {
    const uint8_t* wb = &il.w8[(r / kBlock) * il.cols * kBlock];
    const size_t i = r % kBlock;
    for (size_t t = 0; t < n_tokens; ++t) {
      const int8_t* xq = &a.q[t * il.cols];
      float acc = 0.0f;
      for (size_t k = 0; k < n_super; ++k) {
        int32_t dot = 0;
        for (size_t c = k * kSuper; c < (k + 1) * kSuper; ++c) {
          dot += (static_cast<int32_t>(wb[weight_byte(i, c)]) - 128) * xq[c];
        }
        acc = std::fma(static_cast<float>(dot), a.dx[t * n_super + k], acc);
      }
      y[t * y_stride + r] = il.w8_scale[r] * acc;
    }
  }
}

#ifdef KESTREL_HAVE_VNNI

// AVX512-VNNI: superblocks [k0, k1) of block weights `wb` for NT tokens (1..8) from t0, adding
// to acc[t][0..16). vpdpbusd of v + 128 against xq starts each superblock at -128 S_k.
template <size_t NT>
KESTREL_VNNI_TARGET void tile_vnni(const uint8_t* wb, const SuperActivations& a, size_t cols, size_t t0, size_t k0,
                                   size_t k1, float* acc) {
  const SuperTokens<NT> x(a, t0, cols, kSuper);
  __m512 sum[NT];
  for (size_t t = 0; t < NT; ++t) sum[t] = _mm512_loadu_ps(acc + t * kBlock);
  for (size_t k = k0; k < k1; ++k) {
    __m512i dot[NT];
    for (size_t t = 0; t < NT; ++t) dot[t] = _mm512_set1_epi32(-128 * static_cast<int32_t>(x.sums[t][k]));
    for (size_t quad = k * kQuads; quad < (k + 1) * kQuads; ++quad) {
      const __m512i w = _mm512_loadu_si512(wb + 64 * quad);
      for (size_t t = 0; t < NT; ++t) {
        int32_t four;
        std::memcpy(&four, x.q[t] + 4 * quad, sizeof(four));
        dot[t] = _mm512_dpbusd_epi32(dot[t], w, _mm512_set1_epi32(four));
      }
    }
    for (size_t t = 0; t < NT; ++t) {
      sum[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t]), _mm512_set1_ps(x.dx[t][k]), sum[t]);
    }
  }
  for (size_t t = 0; t < NT; ++t) _mm512_storeu_ps(acc + t * kBlock, sum[t]);
}

void tiles_vnni(const uint8_t* wb, const SuperActivations& a, size_t cols, size_t t0, size_t n, size_t k0, size_t k1,
                float* acc) {
  switch (n) {
    case 8: return tile_vnni<8>(wb, a, cols, t0, k0, k1, acc);
    case 7: return tile_vnni<7>(wb, a, cols, t0, k0, k1, acc);
    case 6: return tile_vnni<6>(wb, a, cols, t0, k0, k1, acc);
    case 5: return tile_vnni<5>(wb, a, cols, t0, k0, k1, acc);
    case 4: return tile_vnni<4>(wb, a, cols, t0, k0, k1, acc);
    case 3: return tile_vnni<3>(wb, a, cols, t0, k0, k1, acc);
    case 2: return tile_vnni<2>(wb, a, cols, t0, k0, k1, acc);
    default: return tile_vnni<1>(wb, a, cols, t0, k0, k1, acc);
  }
}

// AVX2: rows 8 h .. 8 h + 8 of the block, NT tokens (1..4). vpmaddubsw of |v| against
// sign(v) * xq (pairs at most 2 * 127 * 127: no saturation), vpmaddwd to int32.
template <size_t NT>
KESTREL_AVX2_TARGET void tile_avx2(const uint8_t* wb, size_t h, const SuperActivations& a, size_t cols, size_t t0,
                                   size_t k0, size_t k1, float* acc) {
  const SuperTokens<NT> x(a, t0, cols, kSuper);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  __m256 sum[NT];
  for (size_t t = 0; t < NT; ++t) sum[t] = _mm256_loadu_ps(acc + t * kBlock + 8 * h);
  for (size_t k = k0; k < k1; ++k) {
    __m256i dot[NT];
    for (size_t t = 0; t < NT; ++t) dot[t] = _mm256_setzero_si256();
    for (size_t quad = k * kQuads; quad < (k + 1) * kQuads; ++quad) {
      const __m256i v = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * quad + 32 * h)), flip);
      const __m256i magnitude = _mm256_abs_epi8(v);
      for (size_t t = 0; t < NT; ++t) {
        int32_t four;
        std::memcpy(&four, x.q[t] + 4 * quad, sizeof(four));
        const __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(four), v);
        dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x), ones));
      }
    }
    for (size_t t = 0; t < NT; ++t) {
      sum[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), _mm256_set1_ps(x.dx[t][k]), sum[t]);
    }
  }
  for (size_t t = 0; t < NT; ++t) _mm256_storeu_ps(acc + t * kBlock + 8 * h, sum[t]);
}

void tiles_avx2(const uint8_t* wb, const SuperActivations& a, size_t cols, size_t t0, size_t n, size_t k0, size_t k1,
                float* acc) {
  for (size_t h = 0; h < 2; ++h) {
    switch (n) {
      case 4: tile_avx2<4>(wb, h, a, cols, t0, k0, k1, acc); break;
      case 3: tile_avx2<3>(wb, h, a, cols, t0, k0, k1, acc); break;
      case 2: tile_avx2<2>(wb, h, a, cols, t0, k0, k1, acc); break;
      default: tile_avx2<1>(wb, h, a, cols, t0, k0, k1, acc); break;
    }
  }
}

// Blocks of 16 rows: each block's weights pass by in chunks of kChunk superblocks, every token
// tile taking a chunk while it is in L1; acc holds the tokens' sums between chunks (the same
// float32 steps in the same order as the portable path).
void simd(bool vnni, const W4Int8Interleaved& il, const SuperActivations& a, size_t n_tokens, float* y,
          size_t y_stride, size_t row_begin, size_t row_end) {
    const size_t n_super = il.cols / kSuper, tile = vnni ? 8 : 4;
  thread_local std::vector<float> acc;
  acc.resize(n_tokens * kBlock);
  for (size_t blk = row_begin / kBlock; blk * kBlock < row_end; ++blk) {
    const uint8_t* wb = &il.w8[blk * il.cols * kBlock];
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (size_t k0 = 0; k0 < n_super; k0 += kChunk) {
      const size_t k1 = std::min(n_super, k0 + kChunk);
      for (size_t t0 = 0; t0 < n_tokens; t0 += tile) {
        const size_t n = std::min(tile, n_tokens - t0);
        (vnni ? tiles_vnni : tiles_avx2)(wb, a, il.cols, t0, n, k0, k1, &acc[t0 * kBlock]);
      }
    }
    const size_t lo = std::max(row_begin, blk * kBlock), hi = std::min(row_end, (blk + 1) * kBlock);
    for (size_t t = 0; t < n_tokens; ++t) {
      for (size_t r = lo; r < hi; ++r) y[t * y_stride + r] = il.w8_scale[r] * acc[t * kBlock + r - blk * kBlock];
    }
  }
}

#endif  // KESTREL_HAVE_VNNI

}  // namespace

bool w8a8_default() {
  return kernel_options().w8a8;
}

void requantize_w8(const Matrix& w, W4Int8Interleaved& il, ThreadPool* pool) {
  if (w.type != WeightType::kW4 || w.rows % kBlock != 0 || w.cols % kSuper != 0 || w.rows != il.rows ||
      w.cols != il.cols) {
    throw Error("requantize_w8: needs an INT4 matrix of rows of 16 and columns of 128, as its int8 copy");
  }
  // A storage of its own: il may view an image's tensors, or share its storage with copies
  // (whose spans must stay valid); it keeps the one il had alive.
  auto s = std::make_shared<W4Int8Storage>();
  s->w8.assign(il.rows * il.cols, 0);
  s->w8_scale.assign(il.rows, 0.0f);
  auto blocks = [&](size_t b0, size_t b1) {
    std::vector<float> row(w.cols);
    for (size_t blk = b0; blk < b1; ++blk) {
      uint8_t* wb = &s->w8[blk * il.cols * kBlock];
      for (size_t i = 0; i < kBlock; ++i) {
        const size_t r = blk * kBlock + i;
        matrix_row(w, r, row.data());
        float amax = 0.0f;
        for (const float v : row) amax = std::max(amax, std::fabs(v));
        const float scale = amax / 127.0f;
        s->w8_scale[r] = scale;
        for (size_t c = 0; c < w.cols; ++c) {
          const float v = scale > 0.0f ? std::clamp(std::nearbyint(row[c] / scale), -127.0f, 127.0f) : 0.0f;
          wb[weight_byte(i, c)] = static_cast<uint8_t>(static_cast<int32_t>(v) + 128);
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
  il.w8 = s->w8;
  il.w8_scale = s->w8_scale;
  s->previous = std::move(il.owned);
  il.owned = std::move(s);
}

void gemm_w8a8_on(Int8Isa isa, const W4Int8Interleaved& il, const SuperActivations& a, size_t n_tokens, float* y,
                  size_t y_stride, size_t row_begin, size_t row_end) {
  if (il.w8.empty()) throw Error("gemm_w8a8: the matrix has no int8 copy");
  if (!int8_isa_available(isa)) throw Error(std::string("gemm_w8a8: ") + int8_isa_name(isa) + " is not available");
#ifdef KESTREL_HAVE_VNNI
  if (isa != Int8Isa::kPortable) return simd(isa == Int8Isa::kAvx512Vnni, il, a, n_tokens, y, y_stride, row_begin, row_end);
#endif
  scalar(il, a, n_tokens, y, y_stride, row_begin, row_end);
}

}  // namespace kestrel::kernels
