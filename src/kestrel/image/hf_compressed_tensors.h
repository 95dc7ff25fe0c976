// Importing compressed-tensors W4A16 "pack-quantized" checkpoints (what llm-compressor and
// `kestrel export` write) into `kestrel build`, keeping their integers and scales: each
// quantized Linear becomes an image INT4 matrix (NAME.q4, NAME.scales, NAME.mins) in the
// intermediate GGUF, which build_image copies (image/builder.h).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kestrel/formats/gguf_writer.h"
#include "kestrel/formats/safetensors.h"

namespace kestrel::image {

struct CtScheme {
  size_t group_size = 0;
  bool symmetric = true;
};

/// The W4A16 scheme of a checkpoint's config.json; nullopt when it has no quantization_config.
/// Throws kestrel::Error naming `where` for a quantization_config Kestrel cannot keep exactly:
/// another quant_method or format, not 4-bit integer weights in groups (group_size a multiple of
/// 32), quantized activations, activation ordering (g_idx), dynamic weights, or config groups
/// with different weight schemes.
std::optional<CtScheme> compressed_tensors_scheme(const nlohmann::json& config, const std::string& where);

/// A checkpoint tensor's part in a compressed-tensors W4A16 checkpoint, by its name: an INT4
/// matrix's `weight_packed`, one of the tensors read with it (`weight_scale`,
/// `weight_zero_point`, `weight_shape`), or any other tensor. Throws kestrel::Error (`where`
/// first) for a `weight_g_idx`: activation ordering is not kept.
enum class CtRole { kOther, kPacked, kAuxiliary };
CtRole ct_role(const std::string& name, const std::string& where);

/// Writes the image INT4 tensors of the quantized Linear `hf_base` ("model.layers.0.mlp.up_proj",
/// [rows, cols]) of `ckpt`, in order: NAME.q4 (rows * cols / 2 bytes), NAME.scales (fp16
/// [rows, cols / group]), and unless symmetric NAME.mins (fp16: quant::integer_zero_point_min
/// of each scale and zero point). Scales stored as bf16 / f32 are converted to fp16; those that
/// fp16 does not hold exactly are counted and reported through `log`.
/// Throws kestrel::Error for a missing tensor, or a dtype or shape that disagrees with the scheme.
void write_ct_linear(gguf::Writer& w, const safetensors::Checkpoint& ckpt, const std::string& hf_base, size_t rows,
                     size_t cols, const CtScheme& scheme, const std::function<void(const std::string&)>& log);

}  // namespace kestrel::image
