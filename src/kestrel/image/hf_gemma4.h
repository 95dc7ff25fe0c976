// Hugging Face Gemma 4 text checkpoints (config.json with model_type "gemma4" and a
// text_config, as Gemma4ForConditionalGeneration ships, or "gemma4_text" for
// Gemma4ForCausalLM; *.safetensors, sharded or not, BF16/F16/F32; tokenizer.json) as a source
// for `kestrel build`.
//
// The text weights are mapped to the gemma4 GGUF that llama.cpp's converter (class
// Gemma4Model) writes: the same tensor names, norms as stored (Gemma 4 norms have no 1 +),
// layer_scalar as blk.N.layer_output_scale, a generated rope_freqs tensor for the full layers'
// proportional RoPE, the gemma4.* hyperparameters (per-layer feed_forward_length for
// double-wide MLPs, sliding_window_pattern as one bool per layer, shared_kv_layers, ...) and the
// tokenizer as tokenizer.ggml.model "gemma4" with its merges. Vision and audio towers (and their
// embedders) are skipped with a message, as are K/V tensors of KV-shared layers, which no
// implementation reads. A compressed-tensors W4A16 checkpoint (quantization_config, as
// `kestrel export` writes one) has its quantized Linears written as image INT4 tensors, codes
// and scales unchanged (image/hf_compressed_tensors.h).
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace kestrel::image {

/// True when `dir/config.json` declares a Gemma 4 model (model_type gemma4 or gemma4_text).
bool is_hf_gemma4(const std::filesystem::path& dir);

/// Writes the gemma4 GGUF for the checkpoint `dir` to `out` (2-D tensors in the checkpoint's
/// dtype, F32 for F32/F64 sources; 1-D tensors F32), one tensor at a time. `log` receives notes
/// (skipped tensors). Throws kestrel::Error for a missing or inconsistent config, tensor or
/// tokenizer, and for Gemma 4 variants Kestrel does not run (MoE blocks, K = V attention).
/// `assistant`, when not empty, is a Gemma 4 MTP assistant checkpoint (model_type
/// gemma4_assistant, image/hf_gemma4_assistant.h) whose tensors and configuration are added
/// under mtp.* / gemma4_assistant.*, checked against this target first.
void write_hf_gemma4_gguf(const std::filesystem::path& dir, const std::filesystem::path& out,
                          const std::function<void(const std::string&)>& log = {},
                          const std::filesystem::path& assistant = {});

}  // namespace kestrel::image
