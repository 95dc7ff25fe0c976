// Which kernel computes each matrix product, chosen in one place (docs/kernels.md).
//
// Two choices are made, both here:
// - at load, the weight layout of each matrix (choose_layout): the form a kernel reads, kept as
//   stored or copied once (the interleaved copies of gemv_w4_int8.h, gemv_w4_interleaved.h,
//   gemv_q8_interleaved.h);
// - per product, the kernel (choose_kernel): the first rule of registry.cpp's table whose layout
//   and phase match the product and whose need the CPU and the kernel switches (kernel_options.h)
//   meet.
// The int8 kernels then take the fastest instruction set this CPU has (int8_isa.h: AVX512-VNNI,
// AVX2, portable; every path the same bits), named in kernel_label.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kestrel/kernels/kernel_options.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::kernels {

/// How a weight matrix's bytes are laid out for its kernels (Matrix's type and copies).
enum class WeightLayout : uint8_t {
  kF32Rows,            // float32 rows
  kF16Rows,            // IEEE fp16 rows
  kBF16Rows,           // bfloat16 rows
  kQ8_0Rows,           // ggml Q8_0 rows, float32 activations
  kQ8_0Int8Rows,       // Q8_0 rows as stored, int8 activations (Matrix::int8_rows)
  kQ8_0Interleaved,    // the int8 copy, 16 rows interleaved (Matrix::interleaved_q8)
  kW4Rows,             // INT4 rows (matmul.h), bf16 or float32 activations
  kW4Int8Rows,         // INT4 rows as stored, int8 activations (Matrix::int8_rows)
  kW4Interleaved,      // the bf16 decode copy, 16 rows interleaved (Matrix::interleaved)
  kW4Int8Interleaved,  // the int8 copy, 16 rows interleaved (Matrix::interleaved_int8)
};

/// A product's phase: decode (fewer than kTileMinTokens tokens in the whole product: decode rows,
/// batched decoding, draft verification) or prefill (more).
enum class Phase : uint8_t { kDecode, kPrefill, kAny };

/// The kernels matmul runs (each named by kernel_name; the file that holds it in the comment).
enum class Kernel : uint8_t {
  kF32Tiles,             // float32 rows, 4 rows x 4 tokens (matmul.cpp)
  kHalfRows,             // fp16/bf16 rows widened to float32 (matmul.cpp)
  kHalfTilesF32,         // a block of fp16/bf16 rows widened once, float32 tiles (matmul.cpp)
  kBf16Tiles,            // bf16 rows, bf16 dot products (gemm_bf16.h)
  kQ8_0Rows,             // Q8_0 rows, float32 activations (matmul.cpp)
  kQ8_0Int8Rows,         // Q8_0 rows as stored, int8 activations (gemv_q8_rows.h)
  kQ8_0Int8Interleaved,  // Q8_0 int8 copy (gemv_q8_interleaved.h)
  kW4Rows,               // INT4 rows unpacked to float32 (matmul.cpp)
  kW4Bf16Rows,           // INT4 rows, bf16 dot products (gemv_w4_bf16.h)
  kW4Bf16Interleaved,    // INT4 bf16 decode copy (gemv_w4_interleaved.h)
  kW4DequantBf16Tiles,   // a block of INT4 rows dequantized once, bf16 tiles (matmul.cpp, gemm_bf16.h)
  kW4DequantF32Tiles,    // a block of INT4 rows dequantized once, float32 tiles (matmul.cpp)
  kW4Int8,               // INT4 int8 copy, int8 activations (gemv_w4_int8.h)
  kW4W8A8,               // INT4 int8 copy's W8A8 copy, prefill (gemm_w8a8.h)
  kW4AmxBf16,            // INT4 int8 copy on AMX-BF16 tiles, prefill (gemm_w4_amx_bf16.h)
  kW4Int8Rows,           // INT4 rows as stored, int8 activations (gemv_w4_rows.h)
};

/// What a rule needs besides its layout and phase.
enum class Need : uint8_t {
  kNothing,
  kBf16Dot,    // bf16_dot_available() and cols a multiple of 32
  kBf16Rows,   // gemv_w4_bf16_supported(w)
  kW8A8Copy,   // the int8 copy holds the W8A8 copy (kernel switch w8a8 at load)
  kAmxBf16,    // amx_prefill_enabled() (kernel switch amx on a CPU with AMX-BF16)
};

/// One row of the table: for `layout` in `phase`, where `need` holds, `kernel` runs.
struct KernelRule {
  WeightLayout layout;
  Phase phase;
  Need need;
  Kernel kernel;
};

/// The table, in the order choose_kernel reads it (first match).
std::span<const KernelRule> kernel_rules();

/// The layout `w` is in (its type and the copy it carries).
WeightLayout layout_of(const Matrix& w);

/// The phase of a product of `n_tokens` tokens.
inline Phase phase_of(size_t n_tokens) { return n_tokens >= kTileMinTokens ? Phase::kPrefill : Phase::kDecode; }

/// The kernel matmul runs for a product of `w` with `product_tokens` tokens (the whole product's
/// count when a thread computes a share of it). Every layout has a rule that needs nothing for
/// each phase, so there is always one.
Kernel choose_kernel(const Matrix& w, size_t product_tokens);

/// What a matrix is for, at load.
enum class MatrixRole : uint8_t {
  kLayer,        // a layer's matrix
  kHead,         // the dense output head (a copy allowed)
  kHeadInPlace,  // a FlashHead image's head: read as stored, never copied (~190 MB for Gemma 3)
};

/// The layout a load gives `stored` (a matrix as the file holds it, or as converted from a GGUF)
/// for `role`: an int8 copy where int8 activations are chosen (w4_int8_chosen(activations), and
/// for Q8_0 matrices and heads a SIMD int8 path and a quantized model: `quantized_model`, a GGUF's
/// auto form or a W4A16 image), else the bf16 decode copy where the CPU has AVX512-BF16, else as
/// stored. A layer matrix an image stores in the int8 layout alone (`data` null,
/// `interleaved_int8` viewing the image's tensors) keeps it where int8 activations are chosen
/// (kW4Int8Interleaved, no copy); elsewhere the answer is kW4Rows: the loader de-interleaves it
/// (kernels::deinterleave_w4_int8, an owned copy) and asks again for the row-major matrix.
WeightLayout choose_layout(const Matrix& stored, MatrixRole role, bool quantized_model, DecodeActivations activations);

/// "w4-int8", "q8_0-int8-rows", ... (the enum's comment gives the file).
const char* kernel_name(Kernel k);

/// kernel_name with the instruction set it runs on here, e.g. "w4-int8.avx2", "bf16-tiles.avx512bf16",
/// "w4-rows.portable".
std::string kernel_label(Kernel k);

/// Whether each token of a product of `w` gets the same bits whatever the number of tokens in the
/// call (batch-invariant): one kernel for both phases (matmul_rows_invariant).
bool kernel_batch_invariant(const Matrix& w);

}  // namespace kestrel::kernels
