// Turning GGUF tensors into the weight forms the kernels take.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/quant/w4.h"

namespace kestrel::model {

/// How a model's layer matrices are held in memory.
enum class Precision {
  kSource,  // as the file has them: F32 and Q8_0 in place, other types dequantized to float32
  kW4A16,   // INT4 groups with fp16 scales (quant/w4.h), float32 activations
  kBF16,    // bfloat16 (the unquantized baseline)
};

/// Parses "source", "w4a16" or "bf16"; throws kestrel::Error otherwise.
Precision parse_precision(const std::string& name);
const char* precision_name(Precision precision);

struct LoadOptions {
  Precision precision = Precision::kSource;
  size_t group_size = 32;  // kW4A16: weights per fp16 scale
};

/// Weight matrices and vectors of a model, converted to the precision asked for.
class WeightStore {
 public:
  WeightStore(const gguf::File& file, const LoadOptions& options, ThreadPool& pool)
      : file_(&file), options_(options), pool_(&pool) {}

  /// The layer matrix `name` as [rows, cols] in the store's precision. Throws kestrel::Error
  /// if it is missing or its shape is not {cols, rows}.
  kernels::Matrix matrix(const std::string& name, size_t rows, size_t cols);
  /// The same, always in the source form (F32/Q8_0 in place, else float32): the embedding.
  kernels::Matrix source_matrix(const std::string& name, size_t rows, size_t cols);
  /// The 1-D tensor `name` of n elements, as float32.
  const float* vector(const std::string& name, size_t n);
  bool has(const std::string& name) const { return file_->find_tensor(name) != nullptr; }
  /// Parameters seen so far.
  size_t n_params() const { return n_params_; }

 private:
  const gguf::TensorInfo& checked(const std::string& name, std::vector<uint64_t> shape);
  const float* dequantized(const gguf::TensorInfo& info);

  const gguf::File* file_;
  LoadOptions options_;
  ThreadPool* pool_;
  std::deque<std::vector<float>> owned_;
  std::deque<std::vector<uint16_t>> owned_16_;
  std::deque<quant::W4Matrix> owned_w4_;
  size_t n_params_ = 0;
};

}  // namespace kestrel::model
