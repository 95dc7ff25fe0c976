// Hugging Face Gemma 3 text checkpoints (config.json with model_type "gemma3_text" or
// "gemma3", *.safetensors, tokenizer.json) as a source for `kestrel build`.
//
// The checkpoint is mapped to exactly what llama.cpp's convert_hf_to_gguf.py (class
// Gemma3Model) writes: the same tensor names and shapes, every RMSNorm weight stored as 1 + w
// (float32), the embedding trimmed to the tokenizer's size and not scaled, lm_head skipped
// (tied), vision tower / projector tensors skipped; the gemma3.* hyperparameters from
// config.json, plus gemma3.rope.freq_base_swa and gemma3.attention.sliding_window_pattern;
// the tokenizer.ggml.* vocabulary from tokenizer.json (see docs/image-format.md for how the
// scores are derived without tokenizer.model).
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include "kestrel/base/thread_pool.h"
#include "kestrel/image/builder.h"

namespace kestrel::image {

/// True when `path` is a directory holding config.json (a Hugging Face checkpoint).
bool is_hf_checkpoint(const std::filesystem::path& path);

/// Writes the GGUF llama.cpp's converter would write for the checkpoint `dir` to `out` (matrices
/// in the checkpoint's dtype, F32 for F32/F64; norms F32), streaming one tensor at a time.
/// `log` receives notes (skipped tensors). Throws kestrel::Error.
void write_hf_gemma3_gguf(const std::filesystem::path& dir, const std::filesystem::path& out,
                          const std::function<void(const std::string&)>& log = {});

/// build_image() for a checkpoint directory (Gemma 3, or Gemma 4 through image/hf_gemma4.h):
/// converts it to a temporary GGUF next to `out`
/// (removed afterwards) and builds from that. Licence files of the directory are carried.
/// The report's source_bytes is the checkpoint's safetensors size; source_sha256 is that of the
/// intermediate GGUF (recorded in the image as kestrel.build.source_sha256).
BuildReport build_image_from_hf(const std::filesystem::path& dir, const std::filesystem::path& out,
                                const BuildOptions& options, ThreadPool& pool,
                                const std::function<void(const std::string&)>& log = {});

}  // namespace kestrel::image
