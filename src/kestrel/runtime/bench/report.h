// Benchmark results as JSON (every per-request figure; schema "kestrel-bench/1", also written
// by scripts/bench/peers_bench.py) and as the model card's Markdown variants table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/runtime/bench/methodology.h"

namespace kestrel::runtime::bench {

inline constexpr const char* kSchema = "kestrel-bench/1";

/// Everything measured for one model (one row of the variants table).
struct VariantResult {
  std::string variant;    // the row's label
  std::string precision;  // e.g. "W4A16", "BF16", "Q4_K_M (GGUF)"
  std::string runtime;    // e.g. "Kestrel 0.1.0"
  std::string model_path;
  std::optional<uint64_t> size_bytes;  // the model file
  int threads = 0;
  size_t n_ctx = 0;
  std::optional<size_t> rss_idle_bytes;  // at rest with the model loaded, before the suites
  std::optional<size_t> peak_rss_bytes;  // VmHWM at the end
  std::string peak_since;                // "model load" or "process start"
  std::optional<size_t> kv_cache_bytes;
  std::vector<std::string> power_sources;      // sensors summed
  std::vector<std::string> power_unavailable;  // why other sensors were not used
  std::optional<double> idle_power_w;
  double idle_seconds = 0;
  std::vector<SuiteResult> suites;
};

nlohmann::json stat_json(const Stat& s);
nlohmann::json suite_json(const SuiteResult& suite);
nlohmann::json variant_json(const VariantResult& variant);

/// The text a table cell shows for an unmeasurable energy figure: "n/a (no sensor readable:
/// <reasons>)", the reasons shortened to their first clause.
std::string no_sensor_text(const std::vector<std::string>& unavailable);

/// Renders a report ({"schema", "machine", "variants": [variant_json...]}) as Markdown: the
/// variants table (precision, decode tok/s, prefill tok/s, end-to-end, energy per token, peak
/// memory, size), a memory-and-power table, and notes (sensors, machine, methodology).
/// Missing suites show as "—". Throws kestrel::Error when the JSON is not such a report.
std::string markdown_report(const nlohmann::json& report);

}  // namespace kestrel::runtime::bench
