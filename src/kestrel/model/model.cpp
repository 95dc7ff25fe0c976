#include "kestrel/model/model.h"

#include "kestrel/base/error.h"
#include "kestrel/model/gemma3.h"

namespace kestrel::model {

size_t KvCache::bytes() const {
  size_t total = 0;
  for (const auto& layer : layers) total += (layer.k.size() + layer.v.size()) * sizeof(uint16_t);
  return total;
}

std::unique_ptr<Model> load_model(const gguf::File& file, const LoadOptions& options,
                                  ThreadPool& pool) {
  const std::string arch = file.get_string("general.architecture");
  if (arch == "gemma3") return std::make_unique<Gemma3Model>(file, options, pool);
  throw Error("unsupported model architecture '" + arch + "' (supported: gemma3)");
}

}  // namespace kestrel::model
