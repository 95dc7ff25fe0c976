// Matrix products of weight matrices with float32 activations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kestrel/base/thread_pool.h"

namespace kestrel::kernels {

/// Storage of a weight matrix's rows.
enum class WeightType {
  kF32,   // row-major float32
  kQ8_0,  // ggml Q8_0 blocks: per 32 weights, an fp16 scale d and 32 int8 q; w = d * q
  kBF16,  // row-major bfloat16
  kF16,   // row-major IEEE fp16
  kW4,    // INT4 grouped along the row: w = d_g * (q - 8), or d_g * q + m_g with mins; see below
};

/// A weight matrix W of shape [rows, cols] (each row holds the `cols` input weights of one
/// output), as stored by GGUF (ggml ne = {cols, rows}). Non-owning.
///
/// kW4 layout: `data` holds rows * cols / 2 bytes, row-major; each group of `group_size`
/// consecutive weights of a row takes group_size / 2 bytes, byte j holding weight j in its low
/// nibble and weight j + group_size / 2 in its high nibble (ggml's Q4_0 nibble order).
/// `scales` holds rows * (cols / group_size) fp16 scales d_g, row-major. With `mins` (same
/// shape, fp16) a group is affine, w = d_g * q + m_g (zero points); without, symmetric,
/// w = d_g * (q - 8). group_size is a multiple of 32 and divides cols.
/// With 8-bit group parameters (quant::compress_group_params) `scales` and `mins` are null and
/// an affine group's d_g = d_row * s_g, m_g = -m_row * n_g (float32 products), from `scales8`
/// (u8 s_g), `mins8` (u8 n_g), both [rows, cols / group_size], and `row_scales` ([rows, 2] fp16
/// d_row, m_row).
struct W4Interleaved;
struct W4Int8Interleaved;
struct Q8Interleaved;

struct Matrix {
  WeightType type = WeightType::kF32;
  const void* data = nullptr;
  size_t rows = 0;
  size_t cols = 0;
  const uint16_t* scales = nullptr;  // kW4 only
  const uint16_t* mins = nullptr;    // kW4 only; null: symmetric
  size_t group_size = 0;             // kW4 only
  const uint8_t* scales8 = nullptr;     // kW4 with 8-bit group parameters
  const uint8_t* mins8 = nullptr;       // kW4 with 8-bit group parameters
  const uint16_t* row_scales = nullptr; // kW4 with 8-bit group parameters
  /// kW4: a copy with the rows interleaved for the decode kernel (gemv_w4_interleaved.h), which
  /// then computes every product of fewer than kTileMinTokens tokens; null: the row-major kernel.
  const W4Interleaved* interleaved = nullptr;
  /// kW4, where int8 decode activations are chosen (model::LoadOptions::decode_activations): a
  /// copy for the int8-activation kernel (gemv_w4_int8.h), which then computes every product,
  /// decode and prefill, in place of `interleaved` and the tiles (prefill split by tokens). With
  /// `data` null it is a view of an image that stores this layout and the matrix has no
  /// row-major form (no scales, mins, ...; matrix_row and row_slice refuse it).
  const W4Int8Interleaved* interleaved_int8 = nullptr;
  /// kQ8_0, where int8 activations are chosen and the CPU has AVX512-VNNI: the interleaved copy
  /// (gemv_q8_interleaved.h) that then computes every product (activations rounded to int8 per
  /// block of 32, as llama.cpp rounds them for its Q8_0 products); prefill split by tokens. With
  /// `data` null it is a view of an image that stores this layout (image/q8_tensors.h).
  const Q8Interleaved* interleaved_q8 = nullptr;
  /// kQ8_0 or kW4, where int8 activations are chosen but no copy is kept (an output head: a
  /// FlashHead image's, or an INT4 one): every product from the rows as stored (gemv_q8_rows.h,
  /// gemv_w4_rows.h), the bits the interleaved copy's kernel would give on 32-column blocks (not
  /// its superblocks for 8-bit parameters: gemv_w4_int8.h). Kept by row_slice (its
  /// rows stay as stored).
  bool int8_rows = false;
  size_t row_bytes() const;
  /// Bytes of the matrix as stored: rows * row_bytes() plus kW4's group parameters (fp16 scales
  /// and mins, or u8 scales8 / mins8 and the fp16 row_scales). One decode product (one token)
  /// reads all of them once: the figure a bandwidth limit divides.
  size_t bytes() const;
  const uint8_t* row(size_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes(); }
  /// False for a default Matrix (a tensor the model does not have, e.g. Gemma 3's absent
  /// per-layer input gates); an INT4 or Q8_0 matrix in an int8 layout alone (an image's, viewed
  /// in place) has no `data` but is present.
  bool present() const { return data != nullptr || interleaved_int8 != nullptr || interleaved_q8 != nullptr; }
};

/// From this many tokens matmul multiplies W4 and BF16/FP16 weights by tiles (bfloat16 dot
/// products where the CPU has them); fewer tokens go through the decode kernels row by row. The
/// two round differently, so a row's result depends on which side of this its call falls
/// (except for W4 matrices carrying the int8 copy, which take every token count).
inline constexpr size_t kTileMinTokens = 8;

/// True when matmul gives each token of a product with `w` the same bits whatever the number of
/// tokens in the call (1 or many: batch-invariant): F32 and Q8_0 rows, and kW4 on the int8
/// kernels (gemv_w4_int8.h, gemv_w4_rows.h) unless a prefill-only path applies from
/// kTileMinTokens tokens (the opt-in W8A8 copy, AMX-BF16 with KESTREL_AMX=1). False for BF16/FP16
/// rows and kW4 on bf16 activations, whose prefill tiles round otherwise than decode.
bool matmul_rows_invariant(const Matrix& w);

/// y[t, r] = sum_i W[r, i] * x[t, i] for t < n_tokens, r < W.rows.
/// x: float32 [n_tokens, x_stride], y: float32 [n_tokens, y_stride] (strides in elements).
/// Rows are split over the pool. For kQ8_0, cols must be a multiple of 32.
/// Accumulation is float32 (W4A16 issue: activations never go below 16 bits).
void matmul(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
            size_t y_stride, ThreadPool& pool);

/// One product of matmul_same_input: y = W x, y float32 [n_tokens, y_stride].
struct MatmulOutput {
  const Matrix* w = nullptr;
  float* y = nullptr;
  size_t y_stride = 0;
};

/// matmul of several matrices with the same input x (Q/K/V, gate/up) in one parallel loop over
/// the rows of all of them: one pool barrier instead of one per matrix, which decode, a chain of
/// short loops, feels. Each y is bit-identical to matmul's. Throws kestrel::Error as matmul does
/// (checked before any output is written), or when a matrix's cols differ from the first's.
void matmul_same_input(std::span<const MatmulOutput> outputs, const float* x, size_t n_tokens,
                       size_t x_stride, ThreadPool& pool);

/// matmul on the calling thread for rows [row_begin, row_end) of W only; y is indexed by the
/// absolute row. Each row's arithmetic is the same as in matmul (bit-identical results).
void matmul_rows(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
                 size_t y_stride, size_t row_begin, size_t row_end);

/// Rows [begin, begin + count) of W as a matrix of their own (same storage, non-owning).
/// Throws kestrel::Error when the range is outside W.
Matrix row_slice(const Matrix& w, size_t begin, size_t count);

/// Row r's INT4 group parameters as float32 [cols / group_size]: w = d[g] * q + m[g] (for
/// symmetric groups, 16- or 8-bit, m[g] = -8 d[g]). W must be kW4.
void w4_group_params(const Matrix& w, size_t r, float* d, float* m);

/// Row r of W as float32 [cols] (dequantized for quantized types).
void matrix_row(const Matrix& w, size_t r, float* out);

/// Scalar reference of matmul for tests (float64 accumulation).
void matmul_reference(const Matrix& w, const float* x, size_t n_tokens, size_t x_stride, float* y,
                      size_t y_stride);

}  // namespace kestrel::kernels
