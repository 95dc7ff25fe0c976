// Helpers shared by the model tests: the tiny Gemma 4 models' paths and random token ids.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <random>
#include <vector>

#include "kestrel/model/kv_cache.h"

namespace kestrel::model {

/// tests/data/gemma4/NAME/model.gguf ("e2b_tiny", "e4b_tiny").
inline std::filesystem::path tiny_gemma4(const char* name) {
  return std::filesystem::path(KESTREL_SOURCE_DIR) / "tests/data/gemma4" / name / "model.gguf";
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
