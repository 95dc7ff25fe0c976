// Helpers shared by the model tests: the default model's path (or a skip), the tiny Gemma 4
// models' paths and random token ids.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <random>
#include <vector>

#include "kestrel/model/kv_cache.h"
#include "kestrel/runtime/model_path.h"
#include "source_dir.h"

// In a test body: declares `var` as the default model's file (runtime::default_model_path()),
// or skips the test with the reason it is missing.
#define KESTREL_DEFAULT_MODEL_OR_SKIP(var)                \
  std::filesystem::path var;                              \
  try {                                                   \
    var = ::kestrel::runtime::default_model_path();       \
  } catch (const std::exception& e) {                     \
    GTEST_SKIP() << e.what();                             \
  }

namespace kestrel::model {

/// tests/data/gemma4/NAME/model.gguf ("e2b_tiny", "e4b_tiny").
inline std::filesystem::path tiny_gemma4(const char* name) {
  return ::kestrel::testing::source_dir() / "tests/data/gemma4" / name / "model.gguf";
}

/// n ids drawn uniformly from 3 .. min(n_vocab, 4096) - 1 (no BOS/EOS/pad), seeded.
inline std::vector<TokenId> random_tokens(size_t n, size_t n_vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<TokenId> id(3, static_cast<TokenId>(std::min<size_t>(n_vocab, 4096) - 1));
  std::vector<TokenId> t(n);
  for (auto& x : t) x = id(rng);
  return t;
}

}  // namespace kestrel::model
