// Calibration statistics for activation-aware quantization.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kestrel/runtime/engine.h"

namespace kestrel::runtime {

/// Mean squared input activation per input channel, per layer matrix (GGUF tensor name ->
/// [cols]), the importance llama.cpp's imatrix collects (tools/imatrix): quantization error
/// on channel i of a matrix costs E[x_i^2] times as much in its output.
using Importance = std::map<std::string, std::vector<float>>;

/// Runs `tokens` through the engine's model in chunks of `chunk` tokens (each from an empty
/// cache, BOS first as in perplexity) and averages x^2 per input channel of every layer matrix.
/// Throws kestrel::Error if there are fewer than 2 tokens.
Importance collect_importance(Engine& engine, const std::vector<TokenId>& tokens, size_t chunk);

/// The calibration text of `path`: a plain text file as is, or for a .jsonl file (the
/// OpenAssistant export) the "text" of its non-deleted rows in file order, joined by blank
/// lines, stopping once `max_chars` characters are collected.
std::string calibration_text(const std::filesystem::path& path, size_t max_chars);

}  // namespace kestrel::runtime
