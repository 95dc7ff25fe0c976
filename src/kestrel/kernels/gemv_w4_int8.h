// INT4 (kW4) matrix products with int8-quantized activations (x86 AVX512-VNNI `vpdpbusd` or
// AVX2 `vpmaddubsw`, with a portable path computing the same bits: int8_isa.h), for any number
// of tokens: decode rows and, since the int8 copy is chosen for a whole load, prefill chunks
// too (8 tokens a pass: AVX512-VNNI's tiles and AVX2's whole groups of 8; AVX2 takes the rest
// 4 at a time; each token's result does not depend on how many tokens share the call, so with 16-bit group
// parameters a token's INT4 products are the same bits in prefill and decode; with 8-bit ones
// on superblocks and the opt-in W8A8 copy, gemm_w8a8.h, chunks of kTileMinTokens tokens or more
// take that copy and round otherwise than decode, as attention and the head tiles of a prefill
// step do).
// The default where the CPU has AVX512-VNNI or AVX2 (w4_int8_default(); `--kernels bf16` or
// --decode-act bf16 turns it off): rounding the activations to 8 bits costs less accuracy than
// llama.cpp's own 8-bit activation rounding on the same model (docs/quantization.md).
//
// Activations: each token's float32 vector is quantized once per call, per block of 32 columns
// (the numbers of quantize_q8_activations, gemv_q8_interleaved.h; with AVX-512 / AVX2 on those
// paths): d_xb = max|x| / 127 (float32),
// xq_i = round-to-nearest-even(x_i / d_xb) in [-127, 127] (0 where d_xb = 0), S_b = sum xq_i.
// Weights: the 4-bit codes q in 0..15 and per group g (group_size a multiple of 32, so a block
// lies in one group) the scale d_rg and minimum m_rg, w = d_rg * q + m_rg (symmetric groups:
// m_rg = -8 d_rg). Then
//   y_r = sum_b [ d_rg * d_xb * sum_{i in b} q_ri * xq_i  +  m_rg * d_xb * S_b ],   g = group of b,
// computed per row r and token as, in block order b (float32; fma rounds once):
//   D    = sum_{i in b} q_ri * xq_i                       (int32, exact: |D| <= 15 * 127 * 32)
//   acc  = fma(float(D), d_rg * d_xb, acc)                (acc, macc starting at 0)
//   macc = fma(m_rg, float(S_b) * d_xb, macc)
//   y    = acc + macc
// The integers are exact and every float32 operation is the same on every path, so the VNNI and
// AVX2 paths and gemv_w4_int8_scalar agree bit for bit, and each token's result is the same whatever
// the number of tokens computed with it and whatever row range the call covers.
//
// Layout: rows interleaved in blocks of 16. Per block, per 8 columns (an "octet"), 64 bytes:
// 32-bit lane i is row i, its byte j holding column 8o + j in the low nibble and column
// 8o + 4 + j in the high nibble. `& 0x0F` and `>> 4 & 0x0F` of one 64-byte load give the two
// unsigned operands of vpdpbusd against 4 int8 activations broadcast to every lane: 64
// multiply-adds per instruction (vdpbf16ps: 32), and no conversion of the codes. Group
// parameters as gemv_w4_interleaved.h holds them: per block and group the 16 rows' fp16 d and
// m, or for 8-bit parameters u8 s_g, n_g and per-row float32 d_row, m_row (d = d_row * s_g,
// m = -m_row * n_g, or m = d * -8 without n_g: float32 products).
//
// Superblocks (8-bit group parameters, cols a multiple of 128, group_size dividing 128; since
// 2026-12-04): the activations are quantized per superblock k of 128 columns instead, d_xk =
// max|x| / 127 and xq_i as above, S_g = sum_{i in g} xq_i per group; the group parameters stay
// integers until a superblock ends (llama.cpp's Q4_K x Q8_K products do the same with 6-bit
// scales per 256), so a group costs one integer multiply per token instead of three float32
// steps per 32 columns. Per row r and token, per superblock in order:
//   T1   = sum_{g in k} s_g * D_g        (symmetric groups: s_g * (D_g - 8 S_g))   int32, exact:
//   T2   = sum_{g in k} n_g * S_g        (affine groups only)          |T1|, |T2| < 2^26
//   acc1 = fma(float(T1), d_xk, acc1),  acc2 = fma(float(T2), d_xk, acc2)
//   y    = fma(d_row, acc1, -(m_row * acc2))     (symmetric: d_row * acc1)
// i.e. y = sum_k d_xk sum_g (d_g D_g + m_g S_g) with d_g = d_row s_g, m_g = -m_row n_g, the
// products the 32-column formula rounds per block. Coarser activation scales round more: on the
// default model built with --scale-bits 8, KL against bf16 activations 0.00137 -> 0.00316, still
// two thirds of llama.cpp's for its own 8-bit activation rounding (docs/quantization.md).
// w4_int8_superblocks() tells which formula a copy takes. Every path (VNNI: vpmulld for s_g,
// vpdpwssd for the n_g pairs; AVX2: vpmulld, vpmaddwd; portable) gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/kernels/int8_isa.h"
#include "kestrel/kernels/kernel_options.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::quant {
struct W4Matrix;
}  // namespace kestrel::quant

namespace kestrel::kernels {

/// Memory a W4Int8Interleaved owns (the arrays its spans point into where they are not an
/// image's mapped tensors): interleave_w4_int8's copy, and the W8A8 copy requantize_w8 adds.
struct W4Int8Storage {
  std::vector<uint8_t> codes;
  std::vector<uint16_t> scales;
  std::vector<uint16_t> mins;
  std::vector<uint8_t> scales8;
  std::vector<uint8_t> mins8;
  std::vector<float> row_d;
  std::vector<float> row_m;
  std::vector<uint8_t> w8;
  std::vector<float> w8_scale;
  /// Storage that the arrays of a copy made earlier point into (requantize_w8 adds the W8A8 copy
  /// in a storage of its own and keeps the layout's here).
  std::shared_ptr<const W4Int8Storage> previous;
  /// Bytes of all the arrays, `previous`'s included.
  size_t bytes() const;
};

/// A kW4 matrix in the header's layout, for the int8-activation kernels. The arrays are views:
/// into `owned` (interleave_w4_int8: an owning copy), or into memory that outlives this struct
/// (a Kestrel image's mapped tensors, which store this layout: image/int4_tensors.h). Copies
/// share `owned`. The kernels read the spans alone (.data(), .size(), .empty()).
struct W4Int8Interleaved {
  size_t rows = 0;  // a multiple of 16
  size_t cols = 0;  // a multiple of group_size
  size_t group_size = 0;  // a multiple of 32
  std::span<const uint8_t> codes;     // [rows / 16][cols / 8][64]
  std::span<const uint16_t> scales;   // fp16 d [rows / 16][cols / group_size][16] (16-bit parameters)
  std::span<const uint16_t> mins;     // fp16 m, same shape (16-bit parameters; m = -8 d if symmetric)
  std::span<const uint8_t> scales8;   // u8 s_g, same shape (8-bit parameters)
  std::span<const uint8_t> mins8;     // u8 n_g, same shape; empty: symmetric groups, m = -8 d
  std::span<const float> row_d;       // [rows] d_row (8-bit parameters)
  std::span<const float> row_m;       // [rows] m_row (8-bit parameters)
  // The W8A8 copy for prefill (gemm_w8a8.h): superblock matrices where w8a8_default()
  // (KESTREL_W8A8=1, opt-in); empty: none (every token count takes the codes above). Always
  // built at load, in `owned`.
  std::span<const uint8_t> w8;        // [rows / 16][cols / 4][64] v + 128
  std::span<const float> w8_scale;    // [rows] R_r
  /// What the spans point into where this struct owns it; null: every span views outside memory.
  std::shared_ptr<W4Int8Storage> owned;
  bool params8() const { return !scales8.empty(); }
  /// Bytes held in `owned` (0 for a view of an image's tensors without a W8A8 copy).
  size_t owned_bytes() const { return owned ? owned->bytes() : 0; }
};

/// The process default for kAuto: the kernel switches' int8 or bf16 when one is set
/// (kernel_options.h; throws kestrel::Error for a bad KESTREL_KERNELS), else int8 where the CPU has
/// a SIMD int8 path (int8_simd_available(): AVX512-VNNI or AVX2) and bf16 elsewhere (the portable
/// int8 path is slower than the bf16 kernels). int8 is the
/// default because its accuracy cost was measured to be below llama.cpp's own 8-bit activation
/// rounding on the same model (issue #19 item 1's rule; docs/quantization.md).
bool w4_int8_default();

/// Whether a load asking for `a` takes the int8 copy (kAuto: w4_int8_default()).
bool w4_int8_chosen(DecodeActivations a);

/// "auto", "bf16" or "int8" as DecodeActivations; throws kestrel::Error for anything else.
DecodeActivations parse_decode_activations(const std::string& name);

/// True when `w` has the shape this kernel runs: kW4 with 16- or 8-bit group parameters, rows a
/// positive multiple of 16, group_size a positive multiple of 32 dividing cols. (Whether the CPU
/// has SIMD int8 does not matter: gemv_w4_int8 falls back to the portable path.)
bool w4_int8_supported(const Matrix& w);

/// The shape half of w4_int8_supported: rows a positive multiple of 16, group_size a positive
/// multiple of 32 dividing cols (what `kestrel build` checks before it stores a matrix in this
/// layout).
bool w4_int8_shape_supported(size_t rows, size_t cols, size_t group_size);

/// The int8-activation copy of `w` (throws kestrel::Error unless w4_int8_supported(w)); blocks of
/// 16 rows split over `pool`'s threads when one is given. With superblocks and w8a8_default()
/// (gemm_w8a8.h) it also holds the W8A8 copy, which products of kTileMinTokens tokens or more
/// take.
W4Int8Interleaved interleave_w4_int8(const Matrix& w, ThreadPool* pool = nullptr);

/// interleave_w4_int8 without the W8A8 copy: the header's layout alone, a permutation of w's
/// codes and group parameters (symmetric 16-bit groups gain m = -8 d; 8-bit ones widen the fp16
/// row scales to float32). What a Kestrel image stores (docs/image-format.md).
W4Int8Interleaved interleave_w4_int8_layout(const Matrix& w, ThreadPool* pool = nullptr);

/// The inverse of interleave_w4_int8_layout, bit for bit: the row-major kW4 matrix (matmul.h) whose
/// layout `il` is, owned. `zero_points` says whether the matrix had fp16 minimums (16-bit
/// parameters; without, the minimums -8 d the layout holds are dropped and the groups are
/// symmetric again); 8-bit parameters keep mins8 as il has it and narrow row_d, row_m back to fp16
/// (exact: they were fp16). Where a run does not take the int8 kernels (bf16 activations, a CPU
/// without SIMD int8) the loader reads an image's layout through this, one owned copy per matrix.
/// Throws kestrel::Error when il's arrays do not match its shape (check_w4_int8_layout).
quant::W4Matrix deinterleave_w4_int8(const W4Int8Interleaved& il, bool zero_points, ThreadPool* pool = nullptr);

/// Throws kestrel::Error unless `il`'s shape is one the kernels run (w4_int8_shape_supported) and
/// each array has the size the header's layout gives it (16- or 8-bit parameters; mins8 may be
/// empty; no W8A8 copy or a whole one): a view of an image's tensors is checked with this.
void check_w4_int8_layout(const W4Int8Interleaved& il);

/// Adds the W8A8 copy to `il` where interleave_w4_int8 would hold one (superblocks and
/// w8a8_default()): requantized from il's de-interleaved rows (a temporary; `zero_points` as
/// deinterleave_w4_int8 takes it). For a view of an image's layout, which has no W8A8 copy.
void add_default_w8a8(W4Int8Interleaved& il, bool zero_points, ThreadPool* pool = nullptr);

/// y[t * y_stride + r] for t < n_tokens (any count >= 1), r in [row_begin, row_end)
/// (at most il.rows): the header's formula with x[t * x_stride + i] (float32) quantized here,
/// on the fastest path this CPU has (best_int8_isa(), int8_isa.h: AVX512-VNNI, AVX2, else
/// portable); the same bits on every path. With n_tokens >= kTileMinTokens and a W8A8 copy
/// (il.w8 not empty), gemm_w8a8.h's formula instead (the error bound adds R_r / 2 per weight);
/// product_tokens (0: n_tokens) is the token count of the whole product when this call computes
/// a thread's share of it: the choice follows the whole product, so shares of fewer than
/// kTileMinTokens tokens give the bits the whole call would. Error against W x: the activations' rounding,
/// at most d_xb / 2 per element, i.e. |y - W x| <= sum_b (d_xb / 2) sum_{i in b} |w_ri| plus
/// float32 rounding, b the blocks of 32 columns, or the superblocks of 128 where
/// w4_int8_superblocks(il). Throws kestrel::Error for rows past the matrix. Every call quantizes all
/// n_tokens rows of x (matmul splits prefill by tokens so that threads do not repeat it).
void gemv_w4_int8(const W4Int8Interleaved& il, const float* x, size_t n_tokens, size_t x_stride, float* y,
                  size_t y_stride, size_t row_begin, size_t row_end, size_t product_tokens = 0);

/// gemv_w4_int8 on the path of `isa` (int8_isa.h; every path gives the same bits). Throws
/// kestrel::Error where int8_isa_available(isa) is false. For tests and benchmarks.
void gemv_w4_int8_on(Int8Isa isa, const W4Int8Interleaved& il, const float* x, size_t n_tokens, size_t x_stride,
                     float* y, size_t y_stride, size_t row_begin, size_t row_end, size_t product_tokens = 0);

/// True when gemv_w4_int8 runs `il` on the superblock path (the header's "Superblocks": 8-bit
/// group parameters, cols a multiple of 128, group_size dividing 128), false for the 32-column
/// blocks of the formula above.
bool w4_int8_superblocks(const W4Int8Interleaved& il);

/// The portable path of gemv_w4_int8 (every CPU; gemv_w4_int8_on(Int8Isa::kPortable, ...)).
void gemv_w4_int8_scalar(const W4Int8Interleaved& il, const float* x, size_t n_tokens, size_t x_stride, float* y,
                         size_t y_stride, size_t row_begin, size_t row_end);

}  // namespace kestrel::kernels
