#include "kestrel/model/model.h"

#include <unistd.h>

#include <cstdio>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/model/gemma3.h"
#include "kestrel/model/gemma4.h"

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

std::unique_ptr<Model> load_model(const gguf::File& file, const LoadOptions& options,
                                  ThreadPool& pool) {
  const std::string arch = file.get_string("general.architecture");
  if (arch == "gemma3") return std::make_unique<Gemma3Model>(file, options, pool);
  if (arch == "gemma4") return std::make_unique<Gemma4Model>(file, options, pool);
  throw Error("unsupported model architecture '" + arch + "' (supported: gemma3, gemma4)");
}

}  // namespace kestrel::model
