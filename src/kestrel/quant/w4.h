// INT4 weight quantization for W4A16 (weights 4-bit, activations 16-bit or wider).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::quant {

/// An owned INT4 matrix in kernels::WeightType::kW4 layout (see kernels/matmul.h).
struct W4Matrix {
  size_t rows = 0;
  size_t cols = 0;
  size_t group_size = 0;
  std::vector<uint8_t> qs;        // rows * cols / 2 bytes
  std::vector<uint16_t> scales;   // rows * cols / group_size fp16
  std::vector<uint16_t> mins;     // same shape, fp16; empty for symmetric groups
  // 8-bit group parameters (compress_group_params), in place of scales and mins:
  std::vector<uint8_t> scales8;     // rows * cols / group_size s_g
  std::vector<uint8_t> mins8;       // rows * cols / group_size n_g
  std::vector<uint16_t> row_scales; // rows * 2 fp16: d_row, m_row
  kernels::Matrix view() const;
};

/// Symmetric round-to-nearest INT4 with one fp16 scale per group of `group_size` weights along
/// each row: w ~ d * (q - 8), q = clamp(round(w / d) + 8, 0, 15). For each group the scale is
/// chosen, among d = m / c for c in {-8, -7.75, ..., -6.5, 6.5, ..., 7.5} where m is the group's
/// weight of largest magnitude, as the one with the least squared error (ggml's Q4_0 uses
/// c = -8 alone, ggml-quants.c quantize_row_q4_0_ref).
///
/// With zero_points, each group is affine instead: w ~ d * q + m, q in 0..15, fp16 d and m.
/// Start from d = (max - min) / 15, m = min, then alternate rounding q and the weighted
/// least-squares fit of (d, m) to q, keeping the best of the iterations (the approach of ggml's
/// make_qkx2_quants for Q4_K, ggml-quants.c). A source already on a 16-level affine grid per
/// group (a Q4_K tensor) is reproduced to fp16 precision.
///
/// `importance` (optional, [cols]) weights the squared error per input channel (AWQ-style
/// activation statistics); null means uniform.
/// `fast` (affine groups only) starts from the 15-step grid alone instead of six grids, about
/// 6x less work for a slightly larger error (the AWQ scale search, quant/awq.h, uses it).
/// Throws kestrel::Error unless group_size is a multiple of 32 dividing cols.
///
/// `integer_zero_points` (with zero_points): each group's minimum is tied to an integer zero
/// point z in 0..15, m = integer_zero_point_min(d, z), so that the group is exactly
/// w ~ d * (q - z), the form compressed-tensors, AWQ and GPTQ checkpoints store. The fit
/// alternates rounding, the unconstrained least-squares (d, m), z = round(-m / d) clamped to
/// 0..15, and the least-squares d for that z, from the same starting grids.
W4Matrix quantize_w4(const float* w, size_t rows, size_t cols, size_t group_size,
                     const float* importance, bool zero_points, ThreadPool& pool,
                     bool fast = false, bool integer_zero_points = false);

/// The fp16 group minimum that stands for the integer zero point z (0..15) with fp16 scale d:
/// fp16(-(d * z)), the product taken in float32 (exact: 11 + 4 significant bits); +0 for z = 0.
uint16_t integer_zero_point_min(uint16_t d, unsigned z);

/// z when the fp16 pair (d, m) is exactly an integer zero point, i.e. m equals (as a value)
/// integer_zero_point_min(d, z) for a z in 0..15 (with d = 0: m = 0, z = 0); nullopt otherwise.
std::optional<unsigned> integer_zero_point(uint16_t d, uint16_t m);

/// The affine fit quantize_w4 makes for one group of n weights: fp16 scale d and minimum m
/// (w ~ d * q + m, q in 0..15), minimizing the error weighted by `importance` (null: uniform).
void fit_affine_group(const float* w, const float* importance, size_t n, uint16_t& d, uint16_t& m);

/// Re-expresses the affine fp16 group parameters of `q` at 8 bits under one fp16 pair per row,
/// a double quantization of the quantization constants (QLoRA, Dettmers et al. 2023, sec. 3;
/// ggml's Q4_K keeps 6-bit ones per 256 weights, ggml-quants.c): d_g = d_row * s_g and
/// m_g = -m_row * n_g with s_g, n_g in 0..255, d_row = max_g d_g / 255 and
/// m_row = max_g(-m_g) / 255 (a group whose fitted minimum is positive gets n_g = 0). Each group
/// takes, of the floor and ceiling roundings of s_g and of n_g, the pair with the least squared
/// error weighted by `importance`, and its codes are re-rounded against it. At group size 32
/// the parameters shrink from 32 to 16 bits per group (5 to 4.5 bits per weight), which is what
/// memory-bound decode reads less of.
/// `w`: the float32 [q.rows, q.cols] matrix q was quantized from; `importance` as in quantize_w4.
/// Throws kestrel::Error for symmetric groups (no mins) or parameters already at 8 bits.
void compress_group_params(W4Matrix& q, const float* w, const float* importance, ThreadPool& pool);

/// The per-group parameters of a matrix quantized block by block (quantize_w4_rows); with
/// scale_bits 8 the 8-bit fields of W4Matrix instead of scales and mins.
struct W4Groups {
  std::vector<uint16_t> scales;  // rows * cols / group_size fp16
  std::vector<uint16_t> mins;    // same shape; empty for symmetric groups
  std::vector<uint8_t> scales8;
  std::vector<uint8_t> mins8;
  std::vector<uint16_t> row_scales;
};

/// quantize_w4 of a [rows, cols] matrix held as GGUF `type` bytes (`data`: rows rows of
/// gguf::row_bytes(type, cols) bytes, e.g. a memory-mapped BF16 tensor), `block_rows` rows at a
/// time: each block is dequantized to float32 and quantized, and its packed codes (n_rows * cols
/// / 2 bytes, rows in order) are handed to `write_codes`; the scales and mins of every row are
/// returned at the end. At most block_rows * cols float32 values are held at once, so a table
/// far larger than memory (E4B's per-layer token table: 2.8 G values) can be quantized. The
/// quantization is row-local, so the codes, scales and mins equal quantize_w4's on the whole
/// matrix byte for byte, whatever block_rows is.
/// scale_bits 8 applies compress_group_params to each block (it is row-local too).
/// Throws kestrel::Error as quantize_w4 does, when block_rows is 0, when `type` is not
/// readable, when `data` is not rows * row_bytes(type, cols) long, or when scale_bits is not
/// 16, or 8 with zero points.
W4Groups quantize_w4_rows(gguf::TensorType type, std::span<const std::byte> data, size_t rows,
                          size_t cols, size_t group_size, const float* importance, bool zero_points,
                          size_t block_rows,
                          const std::function<void(std::span<const uint8_t>)>& write_codes,
                          ThreadPool& pool, int scale_bits = 16, bool integer_zero_points = false);

/// Root-mean-square error of the quantized matrix against `w` (for reports and tests).
double w4_rms_error(const W4Matrix& q, const float* w);

}  // namespace kestrel::quant
