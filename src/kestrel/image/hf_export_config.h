// The JSON files of `kestrel export` (image/hf_export.h): config.json for the Gemma 3 text
// model, its compressed-tensors quantization_config, and generation_config.json, from an
// image's GGUF metadata.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/formats/gguf.h"

namespace kestrel::image {

/// compressed-tensors' quantization_config for INT4 weights in groups of `group_size` along
/// the input dimension, symmetric (no zero points) or with integer zero points, every Linear
/// but the modules in `ignore` (HF module names, e.g. "lm_head"); activations unquantized.
nlohmann::json compressed_tensors_config(size_t group_size, bool symmetric, const std::vector<std::string>& ignore);

/// config.json of a Gemma3ForCausalLM (model_type gemma3_text) with the hyperparameters of
/// `file` (a gemma3 image or GGUF, read as Kestrel's gemma3 reader does: sliding-window pattern
/// 6 and local RoPE base 10,000 when absent), `vocab_size` embedding rows, `tied` output head,
/// `dtype` ("bfloat16" / "float32"); `quantization` is added as quantization_config unless null.
/// Throws kestrel::Error when a required key is missing.
nlohmann::json gemma3_hf_config(const gguf::File& file, size_t vocab_size, bool tied, const std::string& dtype,
                                const nlohmann::json& quantization);

/// generation_config.json: BOS, EOS (with <end_of_turn> when in the vocabulary) and padding
/// ids; no sampling defaults (servers would apply them to every request).
nlohmann::json gemma3_generation_config(const gguf::File& file);

}  // namespace kestrel::image
