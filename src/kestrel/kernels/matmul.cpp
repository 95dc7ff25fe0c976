// Highway implementation of matmul; compiled once per SIMD target, chosen at run time.
#include "kestrel/kernels/matmul.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemm_bf16.h"
#include "kestrel/kernels/gemm_w4_amx_bf16.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/gemv_q8_rows.h"
#include "kestrel/kernels/gemv_w4_bf16.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/gemv_w4_interleaved.h"
#include "kestrel/kernels/gemv_w4_rows.h"
#include "kestrel/kernels/registry.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kestrel/kernels/matmul.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kestrel::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr size_t kQ8Block = 32;
constexpr size_t kQ8BlockBytes = 34;

// y[t, row0 + r] = W[r] . x[t] for a block of n_rows float32 rows (row stride `cols`) and
// n_tokens >= 1 tokens: 4 rows x 4 tokens per step, 16 accumulators, 8 loads per 16 FMAs.
void GemmF32Block(const float* W, size_t n_rows, size_t cols, const float* x, size_t n_tokens,
                  size_t x_stride, float* y, size_t y_stride, size_t row0) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t vec_cols = cols - cols % N;
  auto dot_tail = [&](const float* wr, const float* xt) {
    float s = 0.0f;
    for (size_t i = vec_cols; i < cols; ++i) s += wr[i] * xt[i];
    return s;
  };
  size_t t = 0;
  for (; t + 4 <= n_tokens; t += 4) {
    const float* xt[4] = {x + t * x_stride, x + (t + 1) * x_stride, x + (t + 2) * x_stride,
                          x + (t + 3) * x_stride};
    size_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
      const float* wr[4] = {W + r * cols, W + (r + 1) * cols, W + (r + 2) * cols, W + (r + 3) * cols};
      decltype(hn::Zero(d)) acc[4][4];
      for (auto& row : acc) for (auto& a : row) a = hn::Zero(d);
      for (size_t i = 0; i < vec_cols; i += N) {
        const auto x0 = hn::LoadU(d, xt[0] + i), x1 = hn::LoadU(d, xt[1] + i);
        const auto x2 = hn::LoadU(d, xt[2] + i), x3 = hn::LoadU(d, xt[3] + i);
        for (size_t k = 0; k < 4; ++k) {
          const auto wv = hn::LoadU(d, wr[k] + i);
          acc[k][0] = hn::MulAdd(wv, x0, acc[k][0]);
          acc[k][1] = hn::MulAdd(wv, x1, acc[k][1]);
          acc[k][2] = hn::MulAdd(wv, x2, acc[k][2]);
          acc[k][3] = hn::MulAdd(wv, x3, acc[k][3]);
        }
      }
      for (size_t k = 0; k < 4; ++k) {
        for (size_t j = 0; j < 4; ++j) {
          y[(t + j) * y_stride + row0 + r + k] = hn::GetLane(hn::SumOfLanes(d, acc[k][j])) + dot_tail(wr[k], xt[j]);
        }
      }
    }
    for (; r < n_rows; ++r) {
      const float* wr = W + r * cols;
      for (size_t j = 0; j < 4; ++j) {
        auto a = hn::Zero(d);
        for (size_t i = 0; i < vec_cols; i += N) a = hn::MulAdd(hn::LoadU(d, wr + i), hn::LoadU(d, xt[j] + i), a);
        y[(t + j) * y_stride + row0 + r] = hn::GetLane(hn::SumOfLanes(d, a)) + dot_tail(wr, xt[j]);
      }
    }
  }
  for (; t < n_tokens; ++t) {
    const float* xt = x + t * x_stride;
    for (size_t r = 0; r < n_rows; ++r) {
      const float* wr = W + r * cols;
      auto a = hn::Zero(d);
      for (size_t i = 0; i < vec_cols; i += N) a = hn::MulAdd(hn::LoadU(d, wr + i), hn::LoadU(d, xt + i), a);
      y[t * y_stride + row0 + r] = hn::GetLane(hn::SumOfLanes(d, a)) + dot_tail(wr, xt);
    }
  }
}

// Four rows times four tokens of float32 weights: 16 accumulators, 8 loads per 16 FMAs.
void MatmulF32Rows(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
                   size_t y_stride, size_t row_begin, size_t row_end) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t cols = w.cols;
  const size_t vec_cols = cols - cols % N;
  const float* W = static_cast<const float*>(w.data);
  auto tail = [&](const float* wr, const float* xt) {
    float s = 0.0f;
    for (size_t i = vec_cols; i < cols; ++i) s += wr[i] * xt[i];
    return s;
  };
  constexpr size_t kRowBlock = 32;  // rows kept hot in L2 while token tiles stream by
  if (n_tokens >= 4) {
    for (size_t rb = row_begin; rb < row_end; rb += kRowBlock) {
      const size_t re = std::min(row_end, rb + kRowBlock);
      GemmF32Block(W + rb * cols, re - rb, cols, x, n_tokens, x_stride, y, y_stride, rb);
    }
    return;
  }
  // Decode (fewer than 4 tokens): four rows per step share each load of x.
  for (size_t rb = row_begin; rb < row_end; rb += kRowBlock) {
    const size_t re = std::min(row_end, rb + kRowBlock);
    for (size_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * x_stride;
      size_t r = rb;
      for (; r + 4 <= re; r += 4) {
        const float* w0 = W + (r + 0) * cols;
        const float* w1 = W + (r + 1) * cols;
        const float* w2 = W + (r + 2) * cols;
        const float* w3 = W + (r + 3) * cols;
        auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
        for (size_t i = 0; i < vec_cols; i += N) {
          const auto xv = hn::LoadU(d, xt + i);
          a0 = hn::MulAdd(hn::LoadU(d, w0 + i), xv, a0);
          a1 = hn::MulAdd(hn::LoadU(d, w1 + i), xv, a1);
          a2 = hn::MulAdd(hn::LoadU(d, w2 + i), xv, a2);
          a3 = hn::MulAdd(hn::LoadU(d, w3 + i), xv, a3);
        }
        y[t * y_stride + r + 0] = hn::GetLane(hn::SumOfLanes(d, a0)) + tail(w0, xt);
        y[t * y_stride + r + 1] = hn::GetLane(hn::SumOfLanes(d, a1)) + tail(w1, xt);
        y[t * y_stride + r + 2] = hn::GetLane(hn::SumOfLanes(d, a2)) + tail(w2, xt);
        y[t * y_stride + r + 3] = hn::GetLane(hn::SumOfLanes(d, a3)) + tail(w3, xt);
      }
      for (; r < re; ++r) {
        const float* wr = W + r * cols;
        auto a = hn::Zero(d);
        for (size_t i = 0; i < vec_cols; i += N) {
          a = hn::MulAdd(hn::LoadU(d, wr + i), hn::LoadU(d, xt + i), a);
        }
        y[t * y_stride + r] = hn::GetLane(hn::SumOfLanes(d, a)) + tail(wr, xt);
      }
    }
  }
}

// fp16 -> f32 of one value with the target's conversion instruction (F16C on x86).
HWY_INLINE float HalfToFloat(const uint8_t* p) {
  const hn::CappedTag<float, 1> d1;
  const hn::Rebind<hwy::float16_t, decltype(d1)> dh1;
  return hn::GetLane(hn::PromoteTo(d1, hn::LoadU(dh1, reinterpret_cast<const hwy::float16_t*>(p))));
}

// Pointers to the activations and outputs of up to 4 tokens from t; returns how many.
size_t TokenTile(const float* x, size_t x_stride, float* y, size_t y_stride, size_t t,
                 size_t n_tokens, const float* xs[4], float* ys[4]) {
  const size_t nt = std::min<size_t>(4, n_tokens - t);
  for (size_t i = 0; i < nt; ++i) {
    xs[i] = x + (t + i) * x_stride;
    ys[i] = y + (t + i) * y_stride;
  }
  return nt;
}

// kT tokens times one Q8_0 row: per block of 32, the int8 codes (converted to float32 once for
// all the tokens) times the token's activations summed in float32 (`part`), then scaled by the
// block's fp16 scale into one of two accumulators, even and odd blocks taking turns (two
// independent FMA chains: one chain made the kernel wait on the FMA latency). The accumulators'
// sum is summed across lanes. Every token sees that same sequence whatever kT is, so a
// (row, token) product does not depend on the tokens computed beside it (decode, verification
// rows and batches agree bit for bit).
template <size_t kT>
void Q8_0RowTile(const uint8_t* row, size_t cols, const float* const* xs, float* const* ys, size_t r) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<int32_t, decltype(d)> di32;
  const hn::Rebind<int8_t, decltype(d)> di8;
  const size_t N = hn::Lanes(d);
  if (kQ8Block % N != 0) {  // lanes that do not tile a block (no such target today): scalar
    for (size_t t = 0; t < kT; ++t) {
      float sum = 0.0f;
      for (size_t b = 0; b < cols / kQ8Block; ++b) {
        const uint8_t* block = row + b * kQ8BlockBytes;
        float part = 0.0f;
        for (size_t i = 0; i < kQ8Block; ++i) {
          part += static_cast<float>(reinterpret_cast<const int8_t*>(block + 2)[i]) * xs[t][b * kQ8Block + i];
        }
        sum += HalfToFloat(block) * part;
      }
      ys[t][r] = sum;
    }
    return;
  }
  using V = decltype(hn::Zero(d));
  V even[kT], odd[kT];
  for (size_t t = 0; t < kT; ++t) even[t] = odd[t] = hn::Zero(d);
  // Block b's products into acc (the accumulator array is chosen by the caller, not indexed by
  // b & 1, which would keep the accumulators in memory).
  const auto add_block = [&](size_t b, V* acc) HWY_ATTR {
    const uint8_t* block = row + b * kQ8BlockBytes;
    const auto* q = reinterpret_cast<const int8_t*>(block + 2);
    const auto scale = hn::Set(d, HalfToFloat(block));
    const size_t col = b * kQ8Block;
    V part[kT];
    const auto q0 = hn::ConvertTo(d, hn::PromoteTo(di32, hn::LoadU(di8, q)));
    for (size_t t = 0; t < kT; ++t) part[t] = hn::Mul(q0, hn::LoadU(d, xs[t] + col));
    for (size_t i = N; i < kQ8Block; i += N) {
      const auto qi = hn::ConvertTo(d, hn::PromoteTo(di32, hn::LoadU(di8, q + i)));
      for (size_t t = 0; t < kT; ++t) part[t] = hn::MulAdd(qi, hn::LoadU(d, xs[t] + col + i), part[t]);
    }
    for (size_t t = 0; t < kT; ++t) acc[t] = hn::MulAdd(scale, part[t], acc[t]);
  };
  const size_t n_blocks = cols / kQ8Block;
  size_t b = 0;
  for (; b + 2 <= n_blocks; b += 2) {
    add_block(b, even);
    add_block(b + 1, odd);
  }
  if (b < n_blocks) add_block(b, even);
  for (size_t t = 0; t < kT; ++t) ys[t][r] = hn::GetLane(hn::SumOfLanes(d, hn::Add(even[t], odd[t])));
}

void MatmulQ8_0Rows(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
                    size_t y_stride, size_t row_begin, size_t row_end) {
  for (size_t r = row_begin; r < row_end; ++r) {  // a row stays in L1 for all the tokens
    for (size_t t = 0; t < n_tokens; t += 4) {
      const float* xs[4];
      float* ys[4];
      const size_t nt = TokenTile(x, x_stride, y, y_stride, t, n_tokens, xs, ys);
      switch (nt) {
        case 4: Q8_0RowTile<4>(w.row(r), w.cols, xs, ys, r); break;
        case 3: Q8_0RowTile<3>(w.row(r), w.cols, xs, ys, r); break;
        case 2: Q8_0RowTile<2>(w.row(r), w.cols, xs, ys, r); break;
        default: Q8_0RowTile<1>(w.row(r), w.cols, xs, ys, r); break;
      }
    }
  }
}

// fp16 -> f32 of n values with the vector conversion.
void HalvesToFloats(const uint16_t* in, size_t n, float* out) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  const auto* src = reinterpret_cast<const hwy::float16_t*>(in);
  size_t g = 0;
  for (; g + N <= n; g += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, src + g)), d, out + g);
  for (; g < n; ++g) out[g] = gguf::fp16_to_fp32(in[g]);
}

// Row r's group scales and offsets as float32: w = q * scale + offset.
void RowScales(const Matrix& w, size_t r, float* scales, float* offsets) {
  const size_t n_groups = w.cols / w.group_size;
  if (w.scales8 != nullptr) {
    w4_group_params(w, r, scales, offsets);
    return;
  }
  HalvesToFloats(w.scales + r * n_groups, n_groups, scales);
  if (w.mins != nullptr) {
    HalvesToFloats(w.mins + r * n_groups, n_groups, offsets);
  } else {
    for (size_t g = 0; g < n_groups; ++g) offsets[g] = -8.0f * scales[g];
  }
}

// Weights [start, start + N) of one INT4 group as float32: they come from N consecutive bytes
// (low nibbles for the first half of the group, high nibbles for the second).
template <class D>
HWY_INLINE hn::Vec<D> UnpackW4(D d, const uint8_t* group_bytes, size_t start, size_t half,
                              hn::Vec<D> scale, hn::Vec<D> offset) {
  const hn::Rebind<int32_t, D> di;
  const hn::Rebind<uint8_t, D> du8;
  const bool low = start < half;
  const auto bytes = hn::PromoteTo(di, hn::LoadU(du8, group_bytes + (low ? start : start - half)));
  const auto q = low ? hn::And(bytes, hn::Set(di, 0x0F)) : hn::ShiftRight<4>(bytes);
  return hn::MulAdd(hn::ConvertTo(d, q), scale, offset);
}

// kT tokens times one INT4 row: each group is unpacked to float once and used kT times.
// Nibble j of a group's bytes is weight j (low) or j + group_size/2 (high), so a run of N
// weights starting at `start` comes from N consecutive bytes.
template <size_t kT>
void W4RowTile(const uint8_t* qs, const float* scales, const float* offsets, size_t cols,
               size_t group_size,
               const float* const* xs, float* const* ys, size_t r) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<int32_t, decltype(d)> di;
  const hn::Rebind<uint8_t, decltype(d)> du8;
  const size_t N = hn::Lanes(d);
  const size_t half = group_size / 2;
  const auto mask = hn::Set(di, 0x0F);
  decltype(hn::Zero(d)) acc[kT];
  for (size_t t = 0; t < kT; ++t) acc[t] = hn::Zero(d);
  for (size_t g = 0; g < cols / group_size; ++g) {
    const auto scale = hn::Set(d, scales[g]);
    const auto offset = hn::Set(d, offsets[g]);
    const uint8_t* qb = qs + g * half;
    if (N == half) {  // e.g. AVX-512 with groups of 32: low nibbles, then high nibbles
      const auto bytes = hn::PromoteTo(di, hn::LoadU(du8, qb));
      const auto w_lo = hn::MulAdd(hn::ConvertTo(d, hn::And(bytes, mask)), scale, offset);
      const auto w_hi = hn::MulAdd(hn::ConvertTo(d, hn::ShiftRight<4>(bytes)), scale, offset);
      const size_t col = g * group_size;
      for (size_t t = 0; t < kT; ++t) {
        acc[t] = hn::MulAdd(w_lo, hn::LoadU(d, xs[t] + col), acc[t]);
        acc[t] = hn::MulAdd(w_hi, hn::LoadU(d, xs[t] + col + half), acc[t]);
      }
      continue;
    }
    for (size_t start = 0; start < group_size; start += N) {
      const auto wv = UnpackW4(d, qb, start, half, scale, offset);
      const size_t col = g * group_size + start;
      for (size_t t = 0; t < kT; ++t) acc[t] = hn::MulAdd(wv, hn::LoadU(d, xs[t] + col), acc[t]);
    }
  }
  for (size_t t = 0; t < kT; ++t) ys[t][r] = hn::GetLane(hn::SumOfLanes(d, acc[t]));
}

// One INT4 row to float32 (the unpacking of W4RowTile, stored instead of multiplied).
void DequantW4Row(const uint8_t* qs, const float* scales, const float* offsets, size_t cols,
                  size_t group_size, float* out) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t half = group_size / 2;
  for (size_t g = 0; g < cols / group_size; ++g) {
    const auto scale = hn::Set(d, scales[g]);
    const auto offset = hn::Set(d, offsets[g]);
    for (size_t start = 0; start < group_size; start += N) {
      hn::StoreU(UnpackW4(d, qs + g * half, start, half, scale, offset), d, out + g * group_size + start);
    }
  }
}

// Prefill of INT4 rows (kW4DequantBf16Tiles, kW4DequantF32Tiles): a block of rows is unpacked
// once (it stays in L2) and multiplied with every token: with bfloat16 dot products (activations
// and the unpacked weights rounded to bf16, float32 accumulation), or by the 4x4 float32 tile.
void W4DequantTiles(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
                    size_t y_stride, size_t row_begin, size_t row_end, bool bf16) {
  const size_t n_groups = w.cols / w.group_size;
  constexpr size_t kRowBlock = 16;
  std::vector<float> scales(n_groups), offsets(n_groups);
  const auto* qs = static_cast<const uint8_t*>(w.data);
  std::vector<float> block(kRowBlock * w.cols);
  if (bf16) {
    std::vector<uint16_t> block16(kRowBlock * w.cols), x16(n_tokens * w.cols);
    for (size_t t = 0; t < n_tokens; ++t) to_bf16(x + t * x_stride, &x16[t * w.cols], w.cols);
    for (size_t rb = row_begin; rb < row_end; rb += kRowBlock) {
      const size_t re = std::min(row_end, rb + kRowBlock);
      for (size_t r = rb; r < re; ++r) {
        RowScales(w, r, scales.data(), offsets.data());
        DequantW4Row(qs + r * (w.cols / 2), scales.data(), offsets.data(), w.cols, w.group_size, block.data());
        to_bf16(block.data(), &block16[(r - rb) * w.cols], w.cols);
      }
      gemm_bf16_block(block16.data(), re - rb, w.cols, x16.data(), n_tokens, w.cols, y, y_stride, rb);
    }
    return;
  }
  for (size_t rb = row_begin; rb < row_end; rb += kRowBlock) {
    const size_t re = std::min(row_end, rb + kRowBlock);
    for (size_t r = rb; r < re; ++r) {
      RowScales(w, r, scales.data(), offsets.data());
      DequantW4Row(qs + r * (w.cols / 2), scales.data(), offsets.data(), w.cols, w.group_size,
                   &block[(r - rb) * w.cols]);
    }
    GemmF32Block(block.data(), re - rb, w.cols, x, n_tokens, x_stride, y, y_stride, rb);
  }
}

// Decode of INT4 rows in float32 (kW4Rows): 16 rows' group parameters at a time, each row
// unpacked once for up to 4 tokens (W4RowTile).
void W4RowsF32(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y, size_t y_stride,
               size_t row_begin, size_t row_end) {
  const size_t n_groups = w.cols / w.group_size;
  constexpr size_t kRowBlock = 16;
  std::vector<float> scales(kRowBlock * n_groups), offsets(kRowBlock * n_groups);
  const auto* qs = static_cast<const uint8_t*>(w.data);
  for (size_t rb = row_begin; rb < row_end; rb += kRowBlock) {
    const size_t re = std::min(row_end, rb + kRowBlock);
    for (size_t r = rb; r < re; ++r) {
      RowScales(w, r, &scales[(r - rb) * n_groups], &offsets[(r - rb) * n_groups]);
    }
    for (size_t t = 0; t < n_tokens; t += 4) {
      const float* xs[4];
      float* ys[4];
      const size_t nt = TokenTile(x, x_stride, y, y_stride, t, n_tokens, xs, ys);
      for (size_t r = rb; r < re; ++r) {
        const uint8_t* row = qs + r * (w.cols / 2);
        const float* sc = &scales[(r - rb) * n_groups];
        const float* of = &offsets[(r - rb) * n_groups];
        switch (nt) {
          case 4: W4RowTile<4>(row, sc, of, w.cols, w.group_size, xs, ys, r); break;
          case 3: W4RowTile<3>(row, sc, of, w.cols, w.group_size, xs, ys, r); break;
          case 2: W4RowTile<2>(row, sc, of, w.cols, w.group_size, xs, ys, r); break;
          default: W4RowTile<1>(row, sc, of, w.cols, w.group_size, xs, ys, r); break;
        }
      }
    }
  }
}

// Decode of INT4 rows with bfloat16 dot products (kW4Bf16Rows): codes as bf16 (128 + q) straight
// into the dot products (gemv_w4_bf16.h); the tokens of a batch of decode rows take each row in
// turn (one read of the weights).
void W4Bf16Rows(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y, size_t y_stride,
                size_t row_begin, size_t row_end) {
  thread_local std::vector<W4GemvInput> inputs;
  if (inputs.size() < n_tokens) inputs.resize(n_tokens);
  for (size_t t = 0; t < n_tokens; ++t) prepare_w4_gemv(x + t * x_stride, w.cols, w.group_size, inputs[t]);
  gemv_w4_bf16_tokens(w, inputs.data(), n_tokens, y, y_stride, row_begin, row_end);
}

// Products from rows as stored with int8 activations (kQ8_0Int8Rows, kW4Int8Rows) or the Q8_0
// int8 copy (kQ8_0Int8Interleaved): the activations rounded once per call.
void Int8Products(Kernel kernel, const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
                  size_t y_stride, size_t row_begin, size_t row_end) {
  thread_local Q8Activations q;  // reused: no allocation per call once warm
  quantize_q8_activations(x, n_tokens, x_stride, w.cols, q);
  switch (kernel) {
    case Kernel::kQ8_0Int8Interleaved: return gemv_q8_interleaved(*w.interleaved_q8, q, y, y_stride, row_begin, row_end);
    case Kernel::kQ8_0Int8Rows: return gemv_q8_rows(w, q, 0, n_tokens, y, y_stride, row_begin, row_end);
    default: return gemv_w4_rows(w, q, 0, n_tokens, y, y_stride, row_begin, row_end);
  }
}

// Scalar conversion of a 16-bit weight (for row tails).
template <typename T>
float HalfWeight(const T* row, size_t j) {
  const uint16_t bits = reinterpret_cast<const uint16_t*>(row)[j];
  if constexpr (std::is_same_v<T, hwy::bfloat16_t>) return gguf::bf16_to_fp32(bits);
  return gguf::fp16_to_fp32(bits);
}

// kT tokens times one 16-bit (bfloat16 or fp16) row, widened to float32 on the fly.
template <size_t kT, typename T>
void HalfRowTile(const T* row, size_t cols, const float* const* xs, float* const* ys, size_t r) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<T, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  decltype(hn::Zero(d)) acc[kT];
  for (size_t t = 0; t < kT; ++t) acc[t] = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= cols; i += N) {
    const auto wv = hn::PromoteTo(d, hn::LoadU(dh, row + i));
    for (size_t t = 0; t < kT; ++t) acc[t] = hn::MulAdd(wv, hn::LoadU(d, xs[t] + i), acc[t]);
  }
  for (size_t t = 0; t < kT; ++t) {
    float tail = 0.0f;
    for (size_t j = i; j < cols; ++j) tail += HalfWeight(row, j) * xs[t][j];
    ys[t][r] = hn::GetLane(hn::SumOfLanes(d, acc[t])) + tail;
  }
}

// Prefill of bfloat16 rows with bfloat16 dot products (kBf16Tiles): the rows are bf16 already;
// the activations are rounded once.
void Bf16Tiles(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y, size_t y_stride,
               size_t row_begin, size_t row_end) {
  constexpr size_t kRowBlock = 16;
  std::vector<uint16_t> x16(n_tokens * w.cols);
  for (size_t t = 0; t < n_tokens; ++t) to_bf16(x + t * x_stride, &x16[t * w.cols], w.cols);
  const auto* rows16 = static_cast<const uint16_t*>(w.data);
  for (size_t rb = row_begin; rb < row_end; rb += kRowBlock) {
    const size_t re = std::min(row_end, rb + kRowBlock);
    gemm_bf16_block(rows16 + rb * w.cols, re - rb, w.cols, x16.data(), n_tokens, w.cols, y, y_stride, rb);
  }
}

// Prefill of bfloat16 (T = hwy::bfloat16_t) or fp16 (T = hwy::float16_t) rows in float32
// (kHalfTilesF32): a block of rows widened once, then the 4x4 float32 tile.
template <typename T>
void HalfTilesF32(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
                  size_t y_stride, size_t row_begin, size_t row_end) {
  const auto* W = static_cast<const T*>(w.data);
  constexpr size_t kRowBlock = 16;
  const hn::ScalableTag<float> d;
  const hn::Rebind<T, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  std::vector<float> block(kRowBlock * w.cols);
  for (size_t rb = row_begin; rb < row_end; rb += kRowBlock) {
    const size_t re = std::min(row_end, rb + kRowBlock);
    const size_t n = (re - rb) * w.cols;
    const T* src = W + rb * w.cols;
    size_t i = 0;
    for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, src + i)), d, &block[i]);
    for (; i < n; ++i) block[i] = HalfWeight(src, i);
    GemmF32Block(block.data(), re - rb, w.cols, x, n_tokens, x_stride, y, y_stride, rb);
  }
}

// Decode of bfloat16 or fp16 rows (kHalfRows): each row widened on the fly for up to 4 tokens.
template <typename T>
void HalfRows(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y, size_t y_stride,
              size_t row_begin, size_t row_end) {
  const auto* W = static_cast<const T*>(w.data);
  constexpr size_t kRowBlock = 16;
  for (size_t rb = row_begin; rb < row_end; rb += kRowBlock) {
    const size_t re = std::min(row_end, rb + kRowBlock);
    for (size_t t = 0; t < n_tokens; t += 4) {
      const float* xs[4];
      float* ys[4];
      const size_t nt = TokenTile(x, x_stride, y, y_stride, t, n_tokens, xs, ys);
      for (size_t r = rb; r < re; ++r) {
        const T* row = W + r * w.cols;
        switch (nt) {
          case 4: HalfRowTile<4>(row, w.cols, xs, ys, r); break;
          case 3: HalfRowTile<3>(row, w.cols, xs, ys, r); break;
          case 2: HalfRowTile<2>(row, w.cols, xs, ys, r); break;
          default: HalfRowTile<1>(row, w.cols, xs, ys, r); break;
        }
      }
    }
  }
}

// The kernel registry.h chooses, on rows [row_begin, row_end). product_tokens: the token count
// of the whole product this call is a share of (the prefill kernels of the int8 copy, W8A8 and
// AMX-BF16, are chosen by it, so the threads' token split does not change bits).
void MatmulRows(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y, size_t y_stride,
                size_t row_begin, size_t row_end, size_t product_tokens) {
  const Kernel kernel = choose_kernel(w, std::max(n_tokens, product_tokens));
  const bool bf16 = w.type == WeightType::kBF16;
  switch (kernel) {
    case Kernel::kF32Tiles:
      return MatmulF32Rows(w, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
    case Kernel::kHalfRows:
      return bf16 ? HalfRows<hwy::bfloat16_t>(w, x, n_tokens, x_stride, y, y_stride, row_begin, row_end)
                  : HalfRows<hwy::float16_t>(w, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
    case Kernel::kHalfTilesF32:
      return bf16 ? HalfTilesF32<hwy::bfloat16_t>(w, x, n_tokens, x_stride, y, y_stride, row_begin, row_end)
                  : HalfTilesF32<hwy::float16_t>(w, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
    case Kernel::kBf16Tiles:
      return Bf16Tiles(w, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
    case Kernel::kQ8_0Rows:
      return MatmulQ8_0Rows(w, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
    case Kernel::kQ8_0Int8Rows:
    case Kernel::kQ8_0Int8Interleaved:
    case Kernel::kW4Int8Rows:
      return Int8Products(kernel, w, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
    case Kernel::kW4Rows:
      return W4RowsF32(w, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
    case Kernel::kW4Bf16Rows:
      return W4Bf16Rows(w, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
    case Kernel::kW4Bf16Interleaved:
      return gemv_w4_interleaved(*w.interleaved, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
    case Kernel::kW4DequantBf16Tiles:
    case Kernel::kW4DequantF32Tiles:
      return W4DequantTiles(w, x, n_tokens, x_stride, y, y_stride, row_begin, row_end,
                            kernel == Kernel::kW4DequantBf16Tiles);
    case Kernel::kW4Int8:
    case Kernel::kW4W8A8:  // gemv_w4_int8 takes the W8A8 copy for the prefill products it is made for
      return gemv_w4_int8(*w.interleaved_int8, x, n_tokens, x_stride, y, y_stride, row_begin, row_end, product_tokens);
    case Kernel::kW4AmxBf16:
      return gemm_w4_amx_bf16(*w.interleaved_int8, x, n_tokens, x_stride, y, y_stride, row_begin, row_end);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kestrel::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kestrel::kernels {

HWY_EXPORT(MatmulRows);

size_t Matrix::row_bytes() const {
  switch (type) {
    case WeightType::kF32:
      return cols * sizeof(float);
    case WeightType::kQ8_0:
      return cols / 32 * 34;
    case WeightType::kBF16:
    case WeightType::kF16:
      return cols * 2;
    case WeightType::kW4:
      return cols / 2;
  }
  return 0;
}

size_t Matrix::bytes() const {
  if (type == WeightType::kW4 && data == nullptr && interleaved_int8 != nullptr) {
    // Held only in the int8 layout (an image that stores it): the arrays a product reads.
    const W4Int8Interleaved& il = *interleaved_int8;
    return il.codes.size() + (il.scales.size() + il.mins.size()) * sizeof(uint16_t) + il.scales8.size() +
           il.mins8.size() + (il.row_d.size() + il.row_m.size()) * sizeof(float);
  }
  size_t total = rows * row_bytes();
  if (type == WeightType::kW4 && group_size > 0) {
    const size_t n_groups = rows * (cols / group_size);
    if (scales != nullptr) total += n_groups * 2;
    if (mins != nullptr) total += n_groups * 2;
    if (scales8 != nullptr) total += n_groups;
    if (mins8 != nullptr) total += n_groups;
    if (row_scales != nullptr) total += rows * 2 * 2;
  }
  return total;
}

namespace {

void check_matmul(const Matrix& w) {
  if (w.type == WeightType::kQ8_0 && w.cols % 32 != 0) {
    throw Error("matmul: Q8_0 matrix with a row length that is not a multiple of 32");
  }
  // An INT4 matrix held only in the int8 layout has no row-major parameters: its kernels read the layout.
  const bool row_params = w.scales != nullptr || (w.scales8 != nullptr && w.mins8 != nullptr && w.row_scales != nullptr);
  if (w.type == WeightType::kW4 &&
      (w.group_size == 0 || w.group_size % 32 != 0 || w.cols % w.group_size != 0 ||
       (!row_params && w.interleaved_int8 == nullptr))) {
    throw Error("matmul: INT4 matrix with group size " + std::to_string(w.group_size) +
                " for rows of " + std::to_string(w.cols));
  }
}

/// Prefill over the int8 copies (gemv_w4_int8.h): the threads split the tokens, not the rows,
/// so that each quantizes only its own tokens' activations (a row split would have every thread
/// quantize all of them) and a chunk's int8 activations stay in L2 while every row block of the
/// weights streams past them once.
constexpr size_t kInt8PrefillChunk = 64;
/// With AMX-BF16 (gemm_w4_amx_bf16.h) a call dequantizes every row block it covers once and
/// multiplies it with all its tokens: longer chunks spread that (E4B's ffn_gate, one thread:
/// 64 tokens 339, 256 tokens 508 GMAC/s).
constexpr size_t kAmxPrefillChunk = 256;

size_t prefill_chunk() { return amx_prefill_enabled() ? kAmxPrefillChunk : kInt8PrefillChunk; }

/// Below 4 tokens a thread (the kernel's tile) the rows are split, as in decode. A Q8_0 matrix
/// read as stored (a FlashHead image's head, gemv_q8_rows.h) is always split by rows: split by
/// tokens, every thread would stream the whole 178 MB head and copy each 16 of its rows to the
/// interleaved layout, the same work once per thread.
bool splits_tokens(const Matrix& w, size_t n_tokens, const ThreadPool& pool) {
  const WeightLayout layout = layout_of(w);
  const bool int8_copy = layout == WeightLayout::kW4Int8Interleaved || layout == WeightLayout::kQ8_0Interleaved ||
                         layout == WeightLayout::kW4Int8Rows;
  return int8_copy && n_tokens >= kTileMinTokens && n_tokens >= 4 * static_cast<size_t>(pool.size());
}

/// Tokens per thread's share: a multiple of the kernels' 4-token tile (AVX2), or from 8 tokens a
/// thread of 8 (AVX512-VNNI's tile, AVX2's 8-token pass), at most prefill_chunk() (larger shares
/// run in chunks of it).
size_t token_grain(size_t n_tokens, const ThreadPool& pool) {
  const size_t per_thread = (n_tokens + pool.size() - 1) / pool.size();
  const size_t tile = per_thread >= 8 ? 8 : 4;
  return std::min(prefill_chunk(), (per_thread + tile - 1) / tile * tile);
}

}  // namespace

void matmul_same_input(std::span<const MatmulOutput> outputs, const float* x, size_t n_tokens,
                       size_t x_stride, ThreadPool& pool) {
  size_t total_rows = 0;
  for (const auto& o : outputs) {
    check_matmul(*o.w);
    if (o.w->cols != outputs[0].w->cols) {
      throw Error("matmul_same_input: rows of " + std::to_string(o.w->cols) + " and of " +
                  std::to_string(outputs[0].w->cols) + " inputs for one input");
    }
    total_rows += o.w->rows;
  }
  bool by_tokens = true;
  for (const auto& o : outputs) by_tokens = by_tokens && splits_tokens(*o.w, n_tokens, pool);
  if (by_tokens) {
    const size_t chunk = prefill_chunk();
    pool.parallel_for(n_tokens, token_grain(n_tokens, pool), [&](size_t begin, size_t end) {
      for (size_t t0 = begin; t0 < end; t0 += chunk) {
        const size_t n = std::min(chunk, end - t0);
        for (const auto& o : outputs) {
          HWY_DYNAMIC_DISPATCH(MatmulRows)(*o.w, x + t0 * x_stride, n, x_stride, o.y + t0 * o.y_stride,
                                           o.y_stride, 0, o.w->rows, n_tokens);
        }
      }
    });
    return;
  }
  // Rows [begin, end) of the matrices stacked in order; each piece goes to its own matrix.
  pool.parallel_for(total_rows, 16, [&](size_t begin, size_t end) {
    size_t offset = 0;
    for (const auto& o : outputs) {
      const size_t lo = std::max(begin, offset), hi = std::min(end, offset + o.w->rows);
      if (lo < hi) {
        HWY_DYNAMIC_DISPATCH(MatmulRows)(*o.w, x, n_tokens, x_stride, o.y, o.y_stride, lo - offset,
                                         hi - offset, n_tokens);
      }
      offset += o.w->rows;
    }
  });
}

void matmul(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
            size_t y_stride, ThreadPool& pool) {
  const MatmulOutput one[] = {{&w, y, y_stride}};
  matmul_same_input(one, x, n_tokens, x_stride, pool);
}

void matmul_rows(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
                 size_t y_stride, size_t row_begin, size_t row_end) {
  HWY_DYNAMIC_DISPATCH(MatmulRows)(w, x, n_tokens, x_stride, y, y_stride, row_begin,
                                   std::min(row_end, w.rows), n_tokens);
}

bool matmul_rows_invariant(const Matrix& w) { return kernel_batch_invariant(w); }

Matrix row_slice(const Matrix& w, size_t begin, size_t count) {
  if (begin > w.rows || count > w.rows - begin) {
    throw Error("row_slice: rows " + std::to_string(begin) + "+" + std::to_string(count) +
                " outside a matrix of " + std::to_string(w.rows));
  }
  if (w.data == nullptr) throw Error("row_slice: the matrix has no rows as stored (an INT4 one in the int8 layout alone)");
  Matrix m = w;
  m.rows = count;
  m.data = w.row(begin);
  m.interleaved = nullptr;  // a slice's rows run through the row-major kernel
  m.interleaved_int8 = nullptr;
  m.interleaved_q8 = nullptr;
  if (w.type == WeightType::kW4) {
    const size_t n_groups = w.cols / w.group_size;
    if (w.scales) m.scales = w.scales + begin * n_groups;
    if (w.mins) m.mins = w.mins + begin * n_groups;
    if (w.scales8) m.scales8 = w.scales8 + begin * n_groups;
    if (w.mins8) m.mins8 = w.mins8 + begin * n_groups;
    if (w.row_scales) m.row_scales = w.row_scales + 2 * begin;
  }
  return m;
}

void w4_group_params(const Matrix& w, size_t r, float* d, float* m) {
  const size_t n_groups = w.cols / w.group_size;
  if (w.scales8 != nullptr) {
    const float d_row = gguf::fp16_to_fp32(w.row_scales[2 * r]);
    const float m_row = gguf::fp16_to_fp32(w.row_scales[2 * r + 1]);
    for (size_t g = 0; g < n_groups; ++g) {
      d[g] = d_row * static_cast<float>(w.scales8[r * n_groups + g]);
      m[g] = w.mins8 != nullptr ? -m_row * static_cast<float>(w.mins8[r * n_groups + g]) : -8.0f * d[g];
    }
    return;
  }
  for (size_t g = 0; g < n_groups; ++g) {
    d[g] = gguf::fp16_to_fp32(w.scales[r * n_groups + g]);
    m[g] = w.mins ? gguf::fp16_to_fp32(w.mins[r * n_groups + g]) : -8.0f * d[g];
  }
}

void matrix_row(const Matrix& w, size_t r, float* out) {
  switch (w.type) {
    case WeightType::kF32:
      std::memcpy(out, w.row(r), w.cols * sizeof(float));
      return;
    case WeightType::kQ8_0:
      gguf::dequantize(gguf::TensorType::kQ8_0, w.row(r), out, w.cols);
      return;
    case WeightType::kBF16:
      gguf::dequantize(gguf::TensorType::kBF16, w.row(r), out, w.cols);
      return;
    case WeightType::kF16:
      gguf::dequantize(gguf::TensorType::kF16, w.row(r), out, w.cols);
      return;
    case WeightType::kW4: {
      if (w.data == nullptr) throw Error("matrix_row: an INT4 matrix in the int8 layout alone has no rows as stored");
      const uint8_t* q = w.row(r);
      const size_t n_groups = w.cols / w.group_size, half = w.group_size / 2;
      thread_local std::vector<float> ds, ms;  // one row per token here: no allocation each time
      ds.resize(n_groups);
      ms.resize(n_groups);
      w4_group_params(w, r, ds.data(), ms.data());
      for (size_t g = 0; g < n_groups; ++g) {
        const float d = ds[g], m = ms[g];
        for (size_t j = 0; j < half; ++j) {
          const uint8_t b = q[g * half + j];
          out[g * w.group_size + j] = d * static_cast<float>(b & 0x0F) + m;
          out[g * w.group_size + j + half] = d * static_cast<float>(b >> 4) + m;
        }
      }
      return;
    }
  }
}

void matmul_reference(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
                      size_t y_stride) {
  std::vector<float> row(w.cols);
  for (size_t r = 0; r < w.rows; ++r) {
    matrix_row(w, r, row.data());
    for (size_t t = 0; t < n_tokens; ++t) {
      double s = 0.0;
      for (size_t i = 0; i < w.cols; ++i) s += static_cast<double>(row[i]) * x[t * x_stride + i];
      y[t * y_stride + r] = static_cast<float>(s);
    }
  }
}

}  // namespace kestrel::kernels
#endif  // HWY_ONCE
