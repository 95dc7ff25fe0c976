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

/// config.json of a Gemma4ForCausalLM (model_type gemma4_text, transformers'
/// Gemma4TextConfig) with the hyperparameters Kestrel runs `file` (a gemma4 image or GGUF) with
/// (model::GemmaConfig::gemma4_from_gguf): per-layer sliding / full attention as layer_types,
/// head sizes (head_dim for sliding layers, global_head_dim for full ones), KV sharing
/// (num_kv_shared_layers), the double-wide MLP of the shared layers (use_double_wide_mlp),
/// per-layer embeddings (hidden_size_per_layer_input, `ple_vocab_size` rows), and both RoPEs:
/// the full layers' "proportional" RoPE with partial_rotary_factor read from `rope_freqs`
/// (llama.cpp's factors, 1 for the rotated pairs and >= 1e30 for the others; all rotated when
/// absent). `vocab_size` embedding rows, `tied` head, `dtype`; `quantization` is added as
/// quantization_config unless null.
/// Throws kestrel::Error for a configuration transformers' Gemma4TextConfig cannot express:
/// per-layer MLP widths other than double-wide shared layers, KV head counts that differ per
/// layer, partial RoPE given by rope.dimension_count, or other rope_freqs factors.
nlohmann::json gemma4_hf_config(const gguf::File& file, const std::vector<float>& rope_freqs, size_t vocab_size,
                                size_t ple_vocab_size, bool tied, const std::string& dtype,
                                const nlohmann::json& quantization);

/// generation_config.json: BOS, EOS (with the end-of-turn token when in the vocabulary:
/// Gemma 3's <end_of_turn>, Gemma 4's <turn|>) and padding ids; no sampling defaults (servers
/// would apply them to every request).
nlohmann::json gemma3_generation_config(const gguf::File& file);

}  // namespace kestrel::image
