#include "kestrel/model/model.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/model/gemma_decoder.h"

namespace kestrel::model {

void Model::forward(std::span<const TokenId> tokens, KvCache& cache, Logits which, float* logits,
                    ThreadPool& pool, ActivationObserver* observer) const {
  const size_t rows = which == Logits::kAll ? tokens.size() : 1;
  std::vector<float> hidden(rows * info().d_model);
  forward_hidden(tokens, cache, which, hidden.data(), pool, observer);
  head::dense_logits(output_head(), hidden.data(), rows, logits, pool);
}

void check_memory(const std::string& what, size_t bytes) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const double total = static_cast<double>(pages) * static_cast<double>(page);
  if (static_cast<double>(bytes) > total) {
    char msg[64];
    std::snprintf(msg, sizeof(msg), "%.1f GiB, more than the %.1f GiB", static_cast<double>(bytes) / (1 << 30), total / (1 << 30));
    throw Error(what + " needs " + msg + " of memory this machine has; use a smaller --ctx");
  }
}

std::optional<size_t> mem_available_bytes(std::string_view meminfo) {
  // A line "MemAvailable:   12345678 kB" (the kernel always writes kB).
  constexpr std::string_view kKey = "MemAvailable:";
  for (size_t pos = 0; pos < meminfo.size();) {
    size_t end = meminfo.find('\n', pos);
    if (end == std::string_view::npos) end = meminfo.size();
    const std::string_view line = meminfo.substr(pos, end - pos);
    pos = end + 1;
    if (line.substr(0, kKey.size()) != kKey) continue;
    size_t i = kKey.size(), kib = 0;
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t digits = i;
    for (; i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i) kib = kib * 10 + static_cast<size_t>(line[i] - '0');
    if (i == digits) return std::nullopt;
    return kib * 1024;
  }
  return std::nullopt;
}

size_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::ostringstream text;
  text << in.rdbuf();
  if (auto bytes = mem_available_bytes(text.str())) return *bytes;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return SIZE_MAX;
  return static_cast<size_t>(pages) * static_cast<size_t>(page);
}

std::string format_bytes(size_t bytes) {
  char text[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(text, sizeof(text), "%.1f GiB", b / (1024.0 * 1024 * 1024));
  } else {
    std::snprintf(text, sizeof(text), "%.0f MiB", b / (1024.0 * 1024));
  }
  return text;
}

std::unique_ptr<Model> load_model(const gguf::File& file, const LoadOptions& options,
                                  ThreadPool& pool) {
  // Every supported architecture is a configuration of the Gemma decoder; GemmaConfig::from_gguf
  // rejects the others before any weight is read.
  return std::make_unique<GemmaDecoder>(file, options, pool);
}

}  // namespace kestrel::model
