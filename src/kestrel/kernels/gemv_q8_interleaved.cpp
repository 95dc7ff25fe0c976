#include "kestrel/kernels/gemv_q8_interleaved.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/int8_isa.h"
#include "kestrel/kernels/x86_int8_targets.h"

namespace kestrel::kernels {
namespace {

constexpr size_t kBlock = 16;        // rows per interleaved block
constexpr size_t kQ8 = 32;           // columns per Q8_0 block
constexpr size_t kQ8Bytes = 34;      // fp16 scale + 32 int8 codes
constexpr size_t kMaxTileTokens = 4; // tokens per pass over a block (AVX2)
// AVX512-VNNI: 8 tokens a pass share each code load and block scale (32 registers hold 8 tokens'
// two chains and sums); the same bits, per token, as 4.
constexpr size_t kMaxTileTokensVnni = 8;
constexpr size_t kPrefetchBytes = 1024;

#ifdef KESTREL_HAVE_VNNI

// Four int8 values as one 32-bit lane broadcast to all 16, loaded by the broadcast itself
// (vpbroadcastd zmm, m32: a load port). Eight bytes read at once and split in general
// registers were broadcast from a register, a uop on the port that also runs vpdpbusd.
KESTREL_VNNI_TARGET inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// Block `block`'s 16 rows for NT tokens (1..8) of x, starting at token t0, into out[t][0..16).
template <size_t NT>
KESTREL_VNNI_TARGET void block16(const Q8Interleaved& il, size_t block, const Q8Activations& x, size_t t0,
                                 float (*out)[kBlock]) {
  const size_t quads = il.cols / 4, nb = il.cols / kQ8;
  const uint8_t* codes = &il.codes[block * quads * 64];
  const float* scales = &il.scales[block * nb * kBlock];
  const int8_t* xq[NT];
  const float* xd[NT];
  const int32_t* xs[NT];
  for (size_t t = 0; t < NT; ++t) {
    xq[t] = &x.q[(t0 + t) * x.cols];
    xd[t] = &x.scale[(t0 + t) * nb];
    xs[t] = &x.sum128[(t0 + t) * nb];
  }
  __m512 acc[NT];
  for (size_t t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    // Two integer chains per token (even and odd quads); integer sums are exact in any order.
    __m512i even[NT], odd[NT];
    for (size_t t = 0; t < NT; ++t) even[t] = odd[t] = _mm512_setzero_si512();
    for (size_t j = 0; j < kQ8 / 4; j += 2) {
      const uint8_t* at = codes + (b * (kQ8 / 4) + j) * 64;
      _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetchBytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(at + 64 + kPrefetchBytes), _MM_HINT_T0);
      const __m512i w0 = _mm512_loadu_si512(at), w1 = _mm512_loadu_si512(at + 64);
      for (size_t t = 0; t < NT; ++t) {
        even[t] = _mm512_dpbusd_epi32(even[t], w0, broadcast4(xq[t] + b * kQ8 + 4 * j));
        odd[t] = _mm512_dpbusd_epi32(odd[t], w1, broadcast4(xq[t] + b * kQ8 + 4 * j + 4));
      }
    }
    const __m512 s = _mm512_loadu_ps(scales + b * kBlock);
    for (size_t t = 0; t < NT; ++t) {
      const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(even[t], odd[t]), _mm512_set1_epi32(xs[t][b]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, _mm512_set1_ps(xd[t][b])), acc[t]);
    }
  }
  for (size_t t = 0; t < NT; ++t) _mm512_storeu_ps(out[t], acc[t]);
}

// Rows row0 .. row0 + 15 of a Q8_0 matrix (row_bytes apart, nb blocks) as one interleaved
// block: interleave_row's bytes for all 16, by a 16 x 8 transpose of 32-bit words per block.
// Rows i and i + 8 share a register (low and high 256 bits); two rounds of unpacks put, in each
// 128-bit lane, one word of four rows side by side, and a two-source permute gathers quad j's
// 16 words (rows 0-15) in order. The 16 block scales are gathered and widened by vcvtph2ps.
KESTREL_VNNI_TARGET void interleave_block16_avx512(const uint8_t* row0, size_t row_bytes, size_t nb, uint8_t* codes,
                                                   float* scales) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(static_cast<int>(row_bytes)));
  // Quad j = 4 h + m (h: first or second 128-bit lane of a row's 32 bytes, m: word in the lane)
  // takes qwords (2h, 2h + 1) and (2h + 4, 2h + 5) of u_m (rows 0-3 | 8-11) and of u_{m+4}
  // (rows 4-7 | 12-15): [u_m.lane h, u_{m+4}.lane h, u_m.lane h+2, u_{m+4}.lane h+2].
  const __m512i pick[2] = {_mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15)};
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* at = row0 + b * kQ8Bytes;
    __m512i z[8];
    for (size_t i = 0; i < 8; ++i) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + i * row_bytes + 2));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + (i + 8) * row_bytes + 2));
      z[i] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), flip);
    }
    __m512i t[8], u[8];
    for (size_t k = 0; k < 4; ++k) {  // rows (2k, 2k + 1): words interleaved
      t[2 * k] = _mm512_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
      t[2 * k + 1] = _mm512_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
    }
    for (size_t g = 0; g < 2; ++g) {  // rows 4g .. 4g + 3: lane L of u[4g + m] = their word 4L + m
      u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
      u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
      u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
      u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (size_t h = 0; h < 2; ++h) {
      for (size_t m = 0; m < 4; ++m) {
        _mm512_storeu_si512(codes + (b * (kQ8 / 4) + 4 * h + m) * 64, _mm512_permutex2var_epi64(u[m], pick[h], u[m + 4]));
      }
    }
    // Each row's fp16 scale: the low half of a 32-bit gather at the block's start.
    const __m512i words = _mm512_i32gather_epi32(offsets, at, 1);
    _mm512_storeu_ps(scales + b * kBlock, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words)));
  }
}

void block_tokens(const Q8Interleaved& il, size_t block, const Q8Activations& x, size_t t0, size_t n,
                  float (*out)[kBlock]) {
  switch (n) {
    case 8: return block16<8>(il, block, x, t0, out);
    case 7: return block16<7>(il, block, x, t0, out);
    case 6: return block16<6>(il, block, x, t0, out);
    case 5: return block16<5>(il, block, x, t0, out);
    case 4: return block16<4>(il, block, x, t0, out);
    case 3: return block16<3>(il, block, x, t0, out);
    case 2: return block16<2>(il, block, x, t0, out);
    default: return block16<1>(il, block, x, t0, out);
  }
}

// AVX2: the 8 rows of half `h` (the first or second 32 bytes of each quad's 64) of block
// `block`, for NT tokens (1..4) of x starting at t0, into out[t][8h .. 8h + 8). The codes are
// stored + 128, too large for vpmaddubsw's pair sums against int8 activations, so the signed
// code w = byte ^ 0x80 goes in as |w| (unsigned) against sign(x, w): |w| * sign(x, w) = w x,
// a pair at most 2 * 128 * 127 = 32,512 < 2^15 (exact); vpmaddwd by ones widens each quad to
// int32. The integer is sum w x = vpdpbusd's sum (w + 128) x - 128 sum x, and the float32
// operations are block16's.
template <size_t NT>
KESTREL_AVX2_TARGET void block8_avx2(const Q8Interleaved& il, size_t block, size_t h, const Q8Activations& x,
                                     size_t t0, float (*out)[kBlock]) {
  const size_t quads = il.cols / 4, nb = il.cols / kQ8;
  const uint8_t* codes = &il.codes[block * quads * 64 + 32 * h];
  const float* scales = &il.scales[block * nb * kBlock + 8 * h];
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  const int8_t* xq[NT];
  const float* xd[NT];
  for (size_t t = 0; t < NT; ++t) {
    xq[t] = &x.q[(t0 + t) * x.cols];
    xd[t] = &x.scale[(t0 + t) * nb];
  }
  __m256 acc[NT];
  for (size_t t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    __m256i dot[NT];
    for (size_t t = 0; t < NT; ++t) dot[t] = _mm256_setzero_si256();
    for (size_t j = 0; j < kQ8 / 4; ++j) {
      const uint8_t* at = codes + (b * (kQ8 / 4) + j) * 64;
      _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetchBytes), _MM_HINT_T0);
      const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)), flip);
      const __m256i w_abs = _mm256_abs_epi8(w);
      for (size_t t = 0; t < NT; ++t) {
        int32_t x4;
        std::memcpy(&x4, xq[t] + b * kQ8 + 4 * j, sizeof(x4));
        const __m256i pairs = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(_mm256_set1_epi32(x4), w));
        dot[t] = _mm256_add_epi32(dot[t], _mm256_madd_epi16(pairs, ones));
      }
    }
    const __m256 s = _mm256_loadu_ps(scales + b * kBlock);
    for (size_t t = 0; t < NT; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), _mm256_mul_ps(s, _mm256_set1_ps(xd[t][b])), acc[t]);
    }
  }
  for (size_t t = 0; t < NT; ++t) _mm256_storeu_ps(&out[t][8 * h], acc[t]);
}

void block_tokens_avx2(const Q8Interleaved& il, size_t block, const Q8Activations& x, size_t t0, size_t n,
                       float (*out)[kBlock]) {
  for (size_t h = 0; h < 2; ++h) {
    switch (n) {
      case 4: block8_avx2<4>(il, block, h, x, t0, out); break;
      case 3: block8_avx2<3>(il, block, h, x, t0, out); break;
      case 2: block8_avx2<2>(il, block, h, x, t0, out); break;
      default: block8_avx2<1>(il, block, h, x, t0, out); break;
    }
  }
}

#endif  // KESTREL_HAVE_VNNI

void check(const Q8Interleaved& il, const Q8Activations& x, size_t row_end) {
  if (x.cols != il.cols) throw Error("gemv_q8_interleaved: activations of " + std::to_string(x.cols) +
                                     " columns for a matrix of " + std::to_string(il.cols));
  if (row_end > il.rows) throw Error("gemv_q8_interleaved: rows past the matrix");
}

// Row r for token t as the header states it (the portable arithmetic; no bounds checks).
float row_result(const Q8Interleaved& il, const Q8Activations& x, size_t t, size_t r) {
  const size_t quads = il.cols / 4, nb = il.cols / kQ8;
  const size_t block = r / kBlock, i = r % kBlock;
  const uint8_t* codes = &il.codes[block * quads * 64 + 4 * i];
  const int8_t* q = &x.q[t * x.cols];
  float acc = 0.0f;
  for (size_t b = 0; b < nb; ++b) {
    int32_t dot = 0;
    for (size_t c = b * kQ8; c < (b + 1) * kQ8; ++c) {
      dot += (static_cast<int32_t>(codes[(c / 4) * 64 + c % 4]) - 128) * q[c];
    }
    const float s = il.scales[(block * nb + b) * kBlock + i] * x.scale[t * nb + b];
    acc = std::fma(static_cast<float>(dot), s, acc);
  }
  return acc;
}

// Row `row` (a Q8_0 row of nb blocks) as row i of an interleaved block: columns 4 j .. 4 j + 3
// at bytes 4 i .. 4 i + 3 of quad j, each code + 128 (a byte's top bit flipped: four at once),
// and its block scales as float32 at scales[b * 16 + i].
void interleave_row(const uint8_t* row, size_t nb, size_t i, uint8_t* codes, float* scales) {
  uint8_t* dst = codes + 4 * i;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* q8 = row + b * kQ8Bytes;
    uint16_t half = 0;
    std::memcpy(&half, q8, sizeof(half));
    scales[b * kBlock + i] = gguf::fp16_to_fp32(half);
    for (size_t j = 0; j < kQ8 / 4; ++j) {
      uint32_t four;
      std::memcpy(&four, q8 + 2 + 4 * j, 4);
      four ^= 0x80808080u;
      std::memcpy(&dst[(b * kQ8 / 4 + j) * 64], &four, 4);
    }
  }
}

}  // namespace

bool vnni_available() { return int8_isa_available(Int8Isa::kAvx512Vnni); }

Q8Interleaved interleave_q8_0(const Matrix& w, ThreadPool* pool) {
  if (w.type != WeightType::kQ8_0 || w.cols % kQ8 != 0 || w.cols == 0) {
    throw Error("interleave_q8_0: not a Q8_0 matrix with a multiple of 32 columns");
  }
  Q8Interleaved il;
  il.rows = w.rows;
  il.cols = w.cols;
  const size_t quads = w.cols / 4, nb = w.cols / kQ8, blocks = il.padded_rows() / kBlock;
  auto storage = std::make_shared<Q8InterleavedStorage>();
  storage->codes.assign(blocks * quads * 64, 128);  // padding rows: code 0
  storage->scales.assign(blocks * nb * kBlock, 0.0f);
  uint8_t* codes = storage->codes.data();
  float* scales = storage->scales.data();
  auto rows = [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) interleave_row(w.row(r), nb, r % kBlock, &codes[r / kBlock * quads * 64],
                                                    &scales[r / kBlock * nb * kBlock]);
  };
  // Split by whole blocks of 16 rows: a block's rows share each 64-byte quad, so no two threads
  // write the same cache line.
  if (pool != nullptr) {
    pool->parallel_for(blocks, 1, [&](size_t b0, size_t b1) { rows(b0 * kBlock, std::min(w.rows, b1 * kBlock)); });
  } else {
    rows(0, w.rows);
  }
  il.codes = storage->codes;
  il.scales = storage->scales;
  il.owned = std::move(storage);
  return il;
}

void check_q8_interleaved(const Q8Interleaved& il) {
  if (il.rows == 0 || il.cols == 0 || il.cols % kQ8 != 0) {
    throw Error("Q8_0 int8 layout of " + std::to_string(il.rows) + " x " + std::to_string(il.cols) +
                ": not a matrix with a multiple of 32 columns");
  }
  if (il.codes.size() != il.padded_rows() * il.cols || il.scales.size() != il.padded_rows() * il.cols / kQ8) {
    throw Error("Q8_0 int8 layout of " + std::to_string(il.rows) + " x " + std::to_string(il.cols) +
                ": arrays of the wrong size");
  }
}

std::vector<std::byte> deinterleave_q8_0(const Q8Interleaved& il, ThreadPool* pool) {
  check_q8_interleaved(il);
  const size_t quads = il.cols / 4, nb = il.cols / kQ8;
  std::vector<std::byte> out(il.rows * nb * kQ8Bytes);
  auto rows = [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const size_t block = r / kBlock, i = r % kBlock;
      const uint8_t* codes = &il.codes[block * quads * 64 + 4 * i];
      const float* scales = &il.scales[block * nb * kBlock + i];
      for (size_t b = 0; b < nb; ++b) {
        std::byte* q8 = out.data() + (r * nb + b) * kQ8Bytes;
        const uint16_t half = gguf::fp32_to_fp16(scales[b * kBlock]);
        std::memcpy(q8, &half, sizeof(half));
        for (size_t j = 0; j < kQ8 / 4; ++j) {
          uint32_t four;
          std::memcpy(&four, &codes[(b * kQ8 / 4 + j) * 64], 4);
          four ^= 0x80808080u;
          std::memcpy(q8 + 2 + 4 * j, &four, 4);
        }
      }
    }
  };
  if (pool != nullptr) {
    pool->parallel_for(il.rows, kBlock, rows);
  } else {
    rows(0, il.rows);
  }
  return out;
}

void gemv_q8_rows_block16_vnni(const Matrix& w, size_t row0, const Q8Activations& x, size_t t_begin, size_t t_end,
                               float* y, size_t y_stride) {
  if (!vnni_available()) throw Error("gemv_q8_rows_block16_vnni: AVX512-VNNI is not available");
  if (w.type != WeightType::kQ8_0 || w.cols != x.cols || w.cols % kQ8 != 0) {
    throw Error("gemv_q8_rows_block16_vnni: not a Q8_0 matrix of the activations' columns");
  }
  if (row0 > w.rows || w.rows - row0 < kBlock) throw Error("gemv_q8_rows_block16_vnni: rows past the matrix");
  if (t_begin > t_end || t_end > x.n_tokens) throw Error("gemv_q8_rows_block16_vnni: tokens past the activations");
#ifdef KESTREL_HAVE_VNNI
  const size_t nb = w.cols / kQ8;
  thread_local Q8InterleavedStorage buffer;
  buffer.codes.resize(w.cols / 4 * 64);
  buffer.scales.resize(nb * kBlock);
  interleave_block16_avx512(w.row(row0), w.row_bytes(), nb, buffer.codes.data(), buffer.scales.data());
  Q8Interleaved il;
  il.rows = kBlock;
  il.cols = w.cols;
  il.codes = buffer.codes;
  il.scales = buffer.scales;
  float out[kMaxTileTokensVnni][kBlock];
  for (size_t t0 = t_begin; t0 < t_end; t0 += kMaxTileTokensVnni) {
    const size_t n = std::min(kMaxTileTokensVnni, t_end - t0);
    block_tokens(il, 0, x, t0, n, out);
    for (size_t t = 0; t < n; ++t) std::copy_n(out[t], kBlock, y + (t0 + t - t_begin) * y_stride);
  }
#else
  (void)y, (void)y_stride;
#endif
}

void quantize_q8_activations(const float* x, size_t n_tokens, size_t x_stride, size_t cols, Q8Activations& out) {
  if (cols % kQ8 != 0) throw Error("quantize_q8_activations: columns not a multiple of 32");
  const size_t nb = cols / kQ8;
  out.n_tokens = n_tokens;
  out.cols = cols;
  out.q.resize(n_tokens * cols);
  out.scale.resize(n_tokens * nb);
  out.sum128.resize(n_tokens * nb);
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t b = 0; b < nb; ++b) {
      const float* v = x + t * x_stride + b * kQ8;
      float amax = 0.0f;
      for (size_t i = 0; i < kQ8; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float d = amax / 127.0f;
      int32_t sum = 0;
      int8_t* q = &out.q[t * cols + b * kQ8];
      for (size_t i = 0; i < kQ8; ++i) {
        const float r = d > 0.0f ? std::clamp(std::nearbyint(v[i] / d), -127.0f, 127.0f) : 0.0f;
        q[i] = static_cast<int8_t>(r);
        sum += q[i];
      }
      out.scale[t * nb + b] = d;
      out.sum128[t * nb + b] = 128 * sum;
    }
  }
}

float gemv_q8_interleaved_row(const Q8Interleaved& il, const Q8Activations& x, size_t t, size_t r) {
  if (t >= x.n_tokens) throw Error("gemv_q8_interleaved_row: token past the activations");
  check(il, x, r + 1);
  return row_result(il, x, t, r);
}

void gemv_q8_interleaved_scalar(const Q8Interleaved& il, const Q8Activations& x, float* y, size_t y_stride,
                                size_t row_begin, size_t row_end) {
  check(il, x, row_end);
  for (size_t r = row_begin; r < row_end; ++r) {
    for (size_t t = 0; t < x.n_tokens; ++t) y[t * y_stride + r] = row_result(il, x, t, r);
  }
}

void gemv_q8_interleaved(const Q8Interleaved& il, const Q8Activations& x, float* y, size_t y_stride,
                         size_t row_begin, size_t row_end) {
  gemv_q8_interleaved_on(best_int8_isa(), il, x, y, y_stride, row_begin, row_end);
}

void gemv_q8_interleaved_on(Int8Isa isa, const Q8Interleaved& il, const Q8Activations& x, float* y,
                            size_t y_stride, size_t row_begin, size_t row_end) {
  if (!int8_isa_available(isa)) {
    throw Error(std::string("gemv_q8_interleaved: ") + int8_isa_name(isa) + " is not available");
  }
#ifdef KESTREL_HAVE_VNNI
  if (isa != Int8Isa::kPortable) {
    check(il, x, row_end);
    float out[kMaxTileTokensVnni][kBlock];
    const size_t tile = isa == Int8Isa::kAvx512Vnni ? kMaxTileTokensVnni : kMaxTileTokens;
    for (size_t blk = row_begin / kBlock; blk * kBlock < row_end; ++blk) {
      const size_t lo = std::max(row_begin, blk * kBlock), hi = std::min(row_end, (blk + 1) * kBlock);
      for (size_t t0 = 0; t0 < x.n_tokens; t0 += tile) {
        const size_t n = std::min(tile, x.n_tokens - t0);
        if (isa == Int8Isa::kAvx512Vnni) {
          block_tokens(il, blk, x, t0, n, out);
        } else {
          block_tokens_avx2(il, blk, x, t0, n, out);
        }
        for (size_t t = 0; t < n; ++t) {
          std::copy(&out[t][lo - blk * kBlock], &out[t][hi - blk * kBlock], y + (t0 + t) * y_stride + lo);
        }
      }
    }
    return;
  }
#endif
  gemv_q8_interleaved_scalar(il, x, y, y_stride, row_begin, row_end);
}

}  // namespace kestrel::kernels
