// Test utility for suites that build images of the default model once per suite.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "kestrel/runtime/model_path.h"

namespace kestrel::testing {

/// Sets `source` to the default model and creates a fresh temporary directory `dir` named after
/// `tag` and this process. Returns false (touching nothing) when the default model is not
/// installed, so the suite can skip.
inline bool prepare_image_dir(const std::string& tag, std::filesystem::path& source,
                              std::filesystem::path& dir) {
  try {
    source = runtime::default_model_path();
  } catch (const std::exception&) {
    return false;
  }
  dir = std::filesystem::temp_directory_path() / ("kestrel_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return true;
}

}  // namespace kestrel::testing
