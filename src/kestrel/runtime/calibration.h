// Calibration statistics for activation-aware quantization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kestrel/quant/awq.h"
#include "kestrel/runtime/engine.h"

namespace kestrel::runtime {

struct CalibrationOptions {
  size_t chunk = 512;        // tokens per forward pass, BOS first, each from an empty cache
  size_t sample_rows = 256;  // input rows kept per distinct matrix input (AWQ's search), 0: none
  uint64_t seed = 0;         // of the row subsample (reservoir sampling)
};

/// Runs `tokens` through the engine's model in chunks (each from an empty cache, BOS first as
/// in perplexity) and records, for the input x of every layer matrix: E[x_i^2] per input
/// channel (the importance llama.cpp's imatrix collects: quantization error on channel i costs
/// E[x_i^2] times as much in the output), E|x_i|, and a uniform subsample of the input rows
/// (reservoir sampling, deterministic for a seed). Matrices fed the same buffer in a row of
/// calls (attention Q/K/V, FFN gate/up) share one record.
/// Throws kestrel::Error if there are fewer than 2 tokens or the chunk is shorter than 2.
quant::ActivationStatsMap collect_activation_stats(Engine& engine, const std::vector<TokenId>& tokens,
                                                   const CalibrationOptions& options);

/// The calibration text of `path`: a plain text file as is, or for a .jsonl file (the
/// OpenAssistant export) the "text" of its non-deleted rows in file order, joined by blank
/// lines, stopping once `max_chars` characters are collected.
std::string calibration_text(const std::filesystem::path& path, size_t max_chars);

}  // namespace kestrel::runtime
