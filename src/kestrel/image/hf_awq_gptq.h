// Importing AWQ ("gemm" version: AutoAWQ, GPTQModel's AWQ export) and GPTQ (AutoGPTQ, GPTQModel,
// optimum) W4A16 checkpoints into `kestrel build`, keeping their integers and scales: each
// quantized Linear becomes an image INT4 matrix (NAME.q4, NAME.scales, and NAME.mins unless
// symmetric) in the intermediate GGUF, which build_image copies (image/builder.h), as for
// compressed-tensors checkpoints (image/hf_compressed_tensors.h).
//
// The layouts, per Linear of [rows = out_features, cols = in_features] with groups of G inputs
// (checked against the libraries' source: AutoAWQ 0.2.9 awq/modules/linear/gemm.py and
// awq/utils/packing_utils.py; GPTQModel 7.7.0 gptqmodel/nn_modules/qlinear/__init__.py and
// gptqmodel/utils/model.py; docs/export.md):
//
//  AWQ gemm:  qweight int32 [cols, rows / 8]: the code of (r, c) in word (c, r / 8) at bits
//             4 * kAwqNibble[r % 8], the interleaved order AutoAWQ packs with (its order map
//             0, 2, 4, 6, 1, 3, 5, 7 lists the output of each nibble);
//             qzeros int32 [cols / G, rows / 8], the group's integer zero point z (0..15) in the
//             same positions; scales fp16 [cols / G, rows]. Dequantized: w = (q - z) * s.
//  GPTQ:      qweight int32 [cols / 8, rows]: the code of (r, c) in word (c / 8, r) at bits
//             4 * (c % 8) (packed along the input); qzeros int32 [cols / G, ceil(rows / 8)]: z of
//             (r, g) in word (g, r / 8) at bits 4 * (r % 8); scales fp16 [cols / G, rows];
//             g_idx int32 [cols], the group of each input. "gptq_v2" stores z; the original
//             "gptq" (v1) format stores z - 1, as GPTQModel writes and reads it: one subtraction
//             of 0x11111111 per 32-bit word (borrows included), undone by adding it back modulo
//             2^32. Dequantized: w = (q - z) * s[g_idx[c]].
//
// Kestrel keeps the codes q and the fp16 scale d = s unchanged; the zero point becomes the
// group minimum m = quant::integer_zero_point_min(d, z) = fp16(-d * z) (w = d * q + m), or,
// for a symmetric GPTQ checkpoint (every z = 8), no minimum (w = d * (q - 8)).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/formats/gguf_writer.h"
#include "kestrel/formats/safetensors.h"

namespace kestrel::image {

/// The bit position / 4 of output r % 8 within an AWQ gemm word (AutoAWQ's AWQ_REVERSE_ORDER).
inline constexpr std::array<unsigned, 8> kAwqNibble = {0, 4, 1, 5, 2, 6, 3, 7};

enum class PackedInt4Format { kAwqGemm, kGptq };

struct AwqGptqScheme {
  PackedInt4Format format = PackedInt4Format::kAwqGemm;
  size_t group_size = 0;
  bool symmetric = false;  // GPTQ sym: every zero point must be 8 (the image stores no minimums)
  bool gptq_v1 = false;    // GPTQ "gptq" checkpoint format: qzeros hold z - 1 (word-wise)
  std::string name;        // "awq-gemm", "gptq" or "gptq_v2": messages and kestrel.quant.method
};

/// The scheme of the checkpoint in `dir` from its config.json `config` quantization_config (or
/// text_config's) when its quant_method is "awq" or "gptq"; without a quantization_config, from
/// dir/quantize_config.json when present (AutoGPTQ's own file: GPTQ when it names no
/// quant_method). nullopt for neither, or another quant_method (compressed-tensors is
/// image/hf_compressed_tensors.h's). Throws kestrel::Error naming the file for an AWQ / GPTQ
/// configuration Kestrel cannot keep exactly: bits other than 4, a group_size
/// that is not a positive multiple of 32 (-1: one group per row), an AWQ version other than
/// "gemm" (gemv, gemv_fast, marlin, exllama, ipex, llm-awq packing) or without zero points, a
/// GPTQ checkpoint_format other than gptq / gptq_v2 (marlin, bitblas, planar), a pack_dtype
/// other than int32, per-module `dynamic` overrides, or a quantized lm_head.
std::optional<AwqGptqScheme> awq_gptq_scheme(const nlohmann::json& config, const std::filesystem::path& dir);

/// True for the tensors read with a Linear's qweight: NAME.qzeros, NAME.scales, NAME.g_idx.
bool is_awq_gptq_aux(const std::string& name);

/// {rows = out_features, cols = in_features} of the quantized Linear `hf_base` (its qweight and
/// scales shapes). Throws kestrel::Error for a missing tensor or inconsistent shapes.
std::pair<uint64_t, uint64_t> awq_gptq_linear_shape(const safetensors::Checkpoint& ckpt, const std::string& hf_base,
                                                    const AwqGptqScheme& scheme);

/// Writes the image INT4 tensors of the quantized Linear `hf_base` ("model.layers.0.mlp.up_proj",
/// [rows, cols]) of `ckpt`, in order: NAME.q4 (rows * cols / 2 bytes), NAME.scales (fp16
/// [rows, cols / group]) and unless symmetric NAME.mins (fp16, integer_zero_point_min). Scales
/// stored as bf16 / f32 are converted to fp16 (those fp16 does not hold exactly are counted and
/// reported through `log`). Throws kestrel::Error for a missing tensor, a dtype or shape that
/// disagrees with the scheme, a g_idx that is not the trivial c / group (activation order
/// without static groups: the groups are not runs of consecutive inputs), a zero point that is
/// not 8 in a symmetric checkpoint, or a negative or non-finite scale.
void write_awq_gptq_linear(gguf::Writer& w, const safetensors::Checkpoint& ckpt, const std::string& hf_base,
                           size_t rows, size_t cols, const AwqGptqScheme& scheme,
                           const std::function<void(const std::string&)>& log);

// The layout conversions (exposed for tests). Codes are returned in Kestrel's kW4 layout
// (kernels/matmul.h: per group of G, byte j holds input j in its low nibble and j + G/2 in its
// high one; rows * cols / 2 bytes); zero points row-major [rows, cols / G], values 0..15.
// Each throws kestrel::Error when the sizes disagree.

/// AWQ gemm qweight [cols, rows / 8] to kW4 codes.
std::vector<uint8_t> awq_unpack_codes(std::span<const int32_t> qweight, size_t rows, size_t cols, size_t group_size);
/// AWQ gemm qzeros [cols / G, rows / 8] to zero points [rows, cols / G].
std::vector<uint8_t> awq_unpack_zeros(std::span<const int32_t> qzeros, size_t rows, size_t n_groups);
/// GPTQ qweight [cols / 8, rows] to kW4 codes.
std::vector<uint8_t> gptq_unpack_codes(std::span<const int32_t> qweight, size_t rows, size_t cols, size_t group_size);
/// GPTQ qzeros [cols / G, ceil(rows / 8)] to zero points [rows, cols / G]; `v1`: stored as
/// z - 1 per word (0x11111111 added back modulo 2^32 first).
std::vector<uint8_t> gptq_unpack_zeros(std::span<const int32_t> qzeros, size_t rows, size_t n_groups, bool v1);

}  // namespace kestrel::image
