#include "kestrel/kernels/gemv_w4_bf16.h"

#include <algorithm>
#include <cstring>

#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemm_bf16.h"

#include "kestrel/kernels/x86_bf16.h"

namespace kestrel::kernels {
namespace {

// Weights per 64-byte load of codes. The load's four 16-byte lanes each give, through
// vpunpck[lh]bw of its low and of its high nibbles, four vectors of 32 bf16 weights:
// vector j (0: low nibbles of bytes 0-7 of each lane, 1: low nibbles of bytes 8-15, 2 and 3: the
// high nibbles of the same bytes), word 8 * lane + k.
constexpr size_t kChunk = 128;

// Software prefetch distances of the decode GEMV (codes stream ahead across rows).
constexpr size_t kPrefetchBytes = 1024;
constexpr size_t kPrefetchRows = 2;

// Row-relative byte of word `word` (0..31) of vector j (0..3) in chunk c (vectors 2 and 3 take
// its high nibble).
size_t chunk_byte(size_t c, size_t j, size_t word) { return 64 * c + 16 * (word / 8) + word % 8 + 8 * (j & 1); }

// Column of the weight that a byte's low (or high) nibble holds: byte b of a group holds weights
// b and b + group_size / 2 of it (matmul.h, kW4 layout).
size_t nibble_column(size_t byte, bool high, size_t group_size) {
  const size_t half = group_size / 2;
  return (byte / half) * group_size + byte % half + (high ? half : 0);
}

#ifdef KESTREL_HAVE_BF16_DOT

KESTREL_BF16_TARGET inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// row_scales for 8-bit group parameters: d_g = d_row * s_g, m_g = -m_row * n_g.
KESTREL_BF16_TARGET __m512 row_scales8(const Matrix& w, const W4GemvInput& in, size_t r, float* scales,
                                       float* offsets) {
  const size_t n_groups = w.cols / w.group_size;
  const uint8_t* s8 = w.scales8 + r * n_groups;
  const uint8_t* n8 = w.mins8 + r * n_groups;
  for (size_t b = 0; b < n_groups; b += 64) {  // as in row_scales: two streams read in bursts
    _mm_prefetch(reinterpret_cast<const char*>(s8 + kPrefetchRows * n_groups) + b, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(n8 + kPrefetchRows * n_groups) + b, _MM_HINT_T0);
  }
  // The row's fp16 pair by the hardware conversion (the software one cost 1 % of E4B decode).
  const __m512 d_row = _mm512_set1_ps(_cvtsh_ss(w.row_scales[2 * r]));
  const __m512 neg_m_row = _mm512_set1_ps(-_cvtsh_ss(w.row_scales[2 * r + 1]));
  __m512 offset_acc = _mm512_setzero_ps();
  for (size_t g = 0; g < n_groups; g += 16) {
    const __mmask16 mask = n_groups - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n_groups - g)) - 1);
    const __m512 d = _mm512_mul_ps(d_row, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, s8 + g))));
    const __m512 m = _mm512_mul_ps(neg_m_row, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, n8 + g))));
    _mm512_mask_storeu_ps(&scales[g], mask, d);
    const __m512 offset = _mm512_fnmadd_ps(d, _mm512_set1_ps(128.0f), m);
    _mm512_mask_storeu_ps(&offsets[g], mask, offset);
    offset_acc = _mm512_fmadd_ps(offset, _mm512_maskz_loadu_ps(mask, &in.group_sums[g]), offset_acc);
  }
  return offset_acc;
}

// Row r's scales as float32 into `scales` ([n_groups] + 16 floats of slack), and the float32
// lanes of sum_g (m_g - 128 d_g) * sum_g(x) (m_g = -8 d_g for symmetric groups): the offsets that
// turn the dot products with 128 + q into the dot products with the weights. The per-group
// offsets m_g - 128 d_g go to `offsets` ([n_groups] floats) for the other tokens of gemv_row_tokens.
KESTREL_BF16_TARGET __m512 row_scales(const Matrix& w, const W4GemvInput& in, size_t r, float* scales,
                                      float* offsets) {
  const size_t n_groups = w.cols / w.group_size;
  if (w.scales8 != nullptr) return row_scales8(w, in, r, scales, offsets);
  const uint16_t* scales16 = w.scales + r * n_groups;
  const uint16_t* mins16 = w.mins != nullptr ? w.mins + r * n_groups : nullptr;
  // The scales and minimums are two more streams, read in short bursts between rows of codes:
  // the hardware prefetchers miss them, so ask for those of kPrefetchRows rows ahead (a
  // prefetch past the end of an array does not fault).
  for (size_t b = 0; b < n_groups * sizeof(uint16_t); b += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(scales16 + kPrefetchRows * n_groups) + b, _MM_HINT_T0);
    if (mins16 != nullptr) {
      _mm_prefetch(reinterpret_cast<const char*>(mins16 + kPrefetchRows * n_groups) + b, _MM_HINT_T0);
    }
  }
  __m512 offset_acc = _mm512_setzero_ps();
  for (size_t g = 0; g < n_groups; g += 16) {
    const __mmask16 mask = n_groups - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n_groups - g)) - 1);
    const __m512 d = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, scales16 + g));
    _mm512_mask_storeu_ps(&scales[g], mask, d);
    const __m512 m = mins16 != nullptr ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, mins16 + g))
                                       : _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
    const __m512 offset = _mm512_fnmadd_ps(d, _mm512_set1_ps(128.0f), m);
    _mm512_mask_storeu_ps(&offsets[g], mask, offset);
    offset_acc = _mm512_fmadd_ps(offset, _mm512_maskz_loadu_ps(mask, &in.group_sums[g]), offset_acc);
  }
  return offset_acc;
}

// The scales of chunk after chunk of a row, without a division per chunk: with groups of at most
// 128 a chunk spans kChunk / G of them (lanes spread by `pattern`), with larger groups a group
// spans G / kChunk chunks (one scale broadcast).
class ChunkScales {
 public:
  ChunkScales(const float* scales, size_t group_size)
      : next_(scales),
        step_(group_size <= kChunk ? kChunk / group_size : 0),
        chunks_per_group_(group_size > kChunk ? group_size / kChunk : 1) {}
  // The scales of the next chunk, in the lanes of its dot products.
  KESTREL_BF16_TARGET __m512 next(__m512i pattern) {
    if (step_ != 0) {
      const __m512 d = _mm512_permutexvar_ps(pattern, _mm512_loadu_ps(next_));
      next_ += step_;
      return d;
    }
    const __m512 d = _mm512_set1_ps(*next_);
    if (++in_group_ == chunks_per_group_) in_group_ = 0, ++next_;
    return d;
  }

 private:
  const float* next_;
  size_t step_, chunks_per_group_, in_group_ = 0;
};

// Lane 4k of the result is _mm512_reduce_add_ps(v[k]) for k < 4, with the same additions in the
// same order as GCC's implementation of it (halves of 8 lanes added, then halves of 4, then lanes
// i and i + 2, then lanes 0 and 1), so bit-identical to it: four sums for the cost of about one.
KESTREL_BF16_TARGET __m512 reduce_add4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 2, 3, 2)),
                                   _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(1, 0, 1, 0)));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(3, 2, 3, 2)),
                                   _mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(1, 0, 1, 0)));
  const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)),
                                 _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)));
  const __m512 w = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_add_ps(w, _mm512_permute_ps(w, _MM_SHUFFLE(2, 3, 0, 1)));
}

// One row: y[r] = sum over chunks of the per-group dot products times the scales, plus the
// offsets. The chunk's activations are loaded before its codes (E4B-shaped model, 8-token
// prompt, alternating runs: median 13.7 tok/s decode against 13.2 the other way round; two rows
// at once, sharing the activation loads, gave 9.7).
KESTREL_BF16_TARGET float gemv_row(const Matrix& w, const W4GemvInput& in, size_t r, float* scales,
                                   float* offsets, __m512i pattern) {
  const size_t G = w.group_size, n_chunks = w.cols / kChunk;
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  const __m512i bf16_128 = _mm512_set1_epi8(0x43);  // 0x43qq is the bfloat16 128 + q
  const __m512 offset_acc = row_scales(w, in, r, scales, offsets);
  const uint8_t* codes = static_cast<const uint8_t*>(w.data) + r * (w.cols / 2);  // kW4 rows: cols / 2 bytes
  const uint16_t* x = in.x.data();
  ChunkScales chunk_scales(scales, G);
  __m512 acc = _mm512_setzero_ps();
  for (size_t c = 0; c < n_chunks; ++c) {
    const uint16_t* xc = x + kChunk * c;
    const __m512bh x0 = as_bh(_mm512_loadu_si512(xc)), x1 = as_bh(_mm512_loadu_si512(xc + 32)),
                   x2 = as_bh(_mm512_loadu_si512(xc + 64)), x3 = as_bh(_mm512_loadu_si512(xc + 96));
    _mm_prefetch(reinterpret_cast<const char*>(codes + 64 * c + kPrefetchBytes), _MM_HINT_T0);
    const __m512i bytes = _mm512_loadu_si512(codes + 64 * c);
    const __m512i lo = _mm512_and_si512(bytes, low_nibbles);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles);
    __m512 dot = _mm512_dpbf16_ps(_mm512_setzero_ps(), as_bh(_mm512_unpacklo_epi8(lo, bf16_128)), x0);
    dot = _mm512_dpbf16_ps(dot, as_bh(_mm512_unpackhi_epi8(lo, bf16_128)), x1);
    dot = _mm512_dpbf16_ps(dot, as_bh(_mm512_unpacklo_epi8(hi, bf16_128)), x2);
    dot = _mm512_dpbf16_ps(dot, as_bh(_mm512_unpackhi_epi8(hi, bf16_128)), x3);
    acc = _mm512_fmadd_ps(dot, chunk_scales.next(pattern), acc);
  }
  return _mm512_reduce_add_ps(acc) + _mm512_reduce_add_ps(offset_acc);
}

// gemv_row for NT tokens (2..8) at once: a chunk's codes are unpacked once and dotted with each
// token's activations in turn; the offsets of all the tokens come from one pass over the group
// parameters, and the final sums from reduce_add4. Per token the same operations in the same
// order as gemv_row, so y is bit-identical to it.
template <size_t NT>
KESTREL_BF16_TARGET void gemv_row_tokens(const Matrix& w, const W4GemvInput* in, size_t r, float* scales,
                                         float* offsets, __m512i pattern, float* y, size_t y_stride) {
  const size_t G = w.group_size, n_chunks = w.cols / kChunk, n_groups = w.cols / G;
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  const __m512i bf16_128 = _mm512_set1_epi8(0x43);
  constexpr size_t kPadded = (NT + 3) / 4 * 4;  // reduce_add4 takes tokens four at a time
  __m512 offset_acc[kPadded], acc[kPadded];
  for (size_t t = 0; t < kPadded; ++t) offset_acc[t] = acc[t] = _mm512_setzero_ps();
  offset_acc[0] = row_scales(w, in[0], r, scales, offsets);  // the scales are every token's
  for (size_t g = 0; g < n_groups; g += 16) {  // row_scales' offset sums for tokens 1.. in one pass
    const __mmask16 mask = n_groups - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n_groups - g)) - 1);
    const __m512 offset = _mm512_maskz_loadu_ps(mask, &offsets[g]);
    for (size_t t = 1; t < NT; ++t) {
      offset_acc[t] = _mm512_fmadd_ps(offset, _mm512_maskz_loadu_ps(mask, &in[t].group_sums[g]), offset_acc[t]);
    }
  }
  const uint16_t* xs[NT];
  for (size_t t = 0; t < NT; ++t) xs[t] = in[t].x.data();
  ChunkScales chunk_scales(scales, G);
  const uint8_t* codes = static_cast<const uint8_t*>(w.data) + r * (w.cols / 2);
  for (size_t c = 0; c < n_chunks; ++c) {
    _mm_prefetch(reinterpret_cast<const char*>(codes + 64 * c + kPrefetchBytes), _MM_HINT_T0);
    const __m512i bytes = _mm512_loadu_si512(codes + 64 * c);
    const __m512i lo = _mm512_and_si512(bytes, low_nibbles);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles);
    const __m512bh w0 = as_bh(_mm512_unpacklo_epi8(lo, bf16_128)), w1 = as_bh(_mm512_unpackhi_epi8(lo, bf16_128)),
                   w2 = as_bh(_mm512_unpacklo_epi8(hi, bf16_128)), w3 = as_bh(_mm512_unpackhi_epi8(hi, bf16_128));
    const __m512 d = chunk_scales.next(pattern);
    for (size_t t = 0; t < NT; ++t) {
      const uint16_t* xc = xs[t] + kChunk * c;
      __m512 dot = _mm512_dpbf16_ps(_mm512_setzero_ps(), w0, as_bh(_mm512_loadu_si512(xc)));
      dot = _mm512_dpbf16_ps(dot, w1, as_bh(_mm512_loadu_si512(xc + 32)));
      dot = _mm512_dpbf16_ps(dot, w2, as_bh(_mm512_loadu_si512(xc + 64)));
      dot = _mm512_dpbf16_ps(dot, w3, as_bh(_mm512_loadu_si512(xc + 96)));
      acc[t] = _mm512_fmadd_ps(dot, d, acc[t]);
    }
  }
  for (size_t t0 = 0; t0 < NT; t0 += 4) {
    const __m512 sums = _mm512_add_ps(reduce_add4(acc[t0], acc[t0 + 1], acc[t0 + 2], acc[t0 + 3]),
                                      reduce_add4(offset_acc[t0], offset_acc[t0 + 1], offset_acc[t0 + 2],
                                                  offset_acc[t0 + 3]));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sums);
    for (size_t t = t0; t < std::min(NT, t0 + 4); ++t) y[t * y_stride + r] = lanes[4 * (t - t0)];
  }
}

KESTREL_BF16_TARGET void gemv_rows(const Matrix& w, const W4GemvInput* in, size_t n_tokens, float* y,
                                   size_t y_stride, size_t row_begin, size_t row_end) {
  const size_t G = w.group_size;
  thread_local std::vector<float> scales, offsets;
  scales.assign(w.cols / G + 16, 0.0f);  // +16: a chunk's scale load reads 16 floats
  offsets.resize(w.cols / G);
  // Float32 lane i of a chunk's dot products sums words 2i, 2i+1, i.e. lane i / 4 of the load;
  // with G <= 128 it belongs to group c * 128 / G + (i / 4) * 32 / G.
  alignas(64) int32_t lane_group[16];
  for (int i = 0; i < 16; ++i) lane_group[i] = G <= kChunk ? static_cast<int32_t>((i / 4) * 32 / G) : 0;
  const __m512i pattern = _mm512_load_si512(lane_group);
  if (n_tokens == 1) {
    for (size_t r = row_begin; r < row_end; ++r) y[r] = gemv_row(w, *in, r, scales.data(), offsets.data(), pattern);
    return;
  }
  // Several tokens: up to eight share each unpacking of a row's codes.
  for (size_t r = row_begin; r < row_end; ++r) {
    for (size_t t = 0; t < n_tokens; t += 8) {
      float* yt = y + t * y_stride;
      float* sc = scales.data();
      float* of = offsets.data();
      switch (std::min<size_t>(8, n_tokens - t)) {
        case 8: gemv_row_tokens<8>(w, in + t, r, sc, of, pattern, yt, y_stride); break;
        case 7: gemv_row_tokens<7>(w, in + t, r, sc, of, pattern, yt, y_stride); break;
        case 6: gemv_row_tokens<6>(w, in + t, r, sc, of, pattern, yt, y_stride); break;
        case 5: gemv_row_tokens<5>(w, in + t, r, sc, of, pattern, yt, y_stride); break;
        case 4: gemv_row_tokens<4>(w, in + t, r, sc, of, pattern, yt, y_stride); break;
        case 3: gemv_row_tokens<3>(w, in + t, r, sc, of, pattern, yt, y_stride); break;
        case 2: gemv_row_tokens<2>(w, in + t, r, sc, of, pattern, yt, y_stride); break;
        default: yt[r] = gemv_row(w, in[t], r, sc, of, pattern); break;
      }
    }
  }
}

// sums[g] = sum of the bf16 values x[g * G, (g + 1) * G) in float32.
KESTREL_BF16_TARGET void group_sums(const uint16_t* x, size_t cols, size_t G, float* sums) {
  for (size_t g = 0; g < cols / G; ++g) {
    __m512 acc = _mm512_setzero_ps();
    for (size_t i = g * G; i < (g + 1) * G; i += 16) {
      const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
      acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16)));
    }
    sums[g] = _mm512_reduce_add_ps(acc);
  }
}

#endif  // KESTREL_HAVE_BF16_DOT

}  // namespace

bool gemv_w4_bf16_supported(const Matrix& w) {
  if (w.type != WeightType::kW4 || w.group_size == 0 || w.cols % kChunk != 0) return false;
  if (kChunk % w.group_size != 0 && w.group_size % kChunk != 0) return false;
  return bf16_dot_available();
}

void prepare_w4_gemv(const float* x, size_t cols, size_t group_size, W4GemvInput& out) {
  out.cols = cols;
  out.group_size = group_size;
  thread_local std::vector<uint16_t> natural;
  natural.resize(cols);
  to_bf16(x, natural.data(), cols);
  out.group_sums.assign(cols / group_size, 0.0f);
#ifdef KESTREL_HAVE_BF16_DOT
  if (bf16_dot_available()) {
    group_sums(natural.data(), cols, group_size, out.group_sums.data());
  } else
#endif
  {
    for (size_t i = 0; i < cols; ++i) out.group_sums[i / group_size] += gguf::bf16_to_fp32(natural[i]);
  }
  // Each run of 8 words of a vector comes from 8 consecutive bytes inside one half-group, i.e.
  // 8 consecutive columns.
  out.x.resize(cols);
  for (size_t c = 0; c < cols / kChunk; ++c) {
    for (size_t j = 0; j < 4; ++j) {
      for (size_t word = 0; word < 32; word += 8) {
        const size_t col = nibble_column(chunk_byte(c, j, word), j >= 2, group_size);
        std::memcpy(&out.x[kChunk * c + 32 * j + word], &natural[col], 8 * sizeof(uint16_t));
      }
    }
  }
}

void gemv_w4_bf16(const Matrix& w, const W4GemvInput& in, float* y, size_t row_begin, size_t row_end) {
  gemv_w4_bf16_tokens(w, &in, 1, y, 0, row_begin, row_end);
}

void gemv_w4_bf16_tokens(const Matrix& w, const W4GemvInput* in, size_t n_tokens, float* y, size_t y_stride,
                         size_t row_begin, size_t row_end) {
#ifdef KESTREL_HAVE_BF16_DOT
  gemv_rows(w, in, n_tokens, y, y_stride, row_begin, row_end);
#else
  (void)w, (void)in, (void)n_tokens, (void)y, (void)y_stride, (void)row_begin, (void)row_end;
#endif
}

}  // namespace kestrel::kernels
