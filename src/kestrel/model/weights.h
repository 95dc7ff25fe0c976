// Turning GGUF tensors into the weight forms the kernels take.
#pragma once

#include <string>
#include <vector>

#include "kestrel/formats/gguf.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::model {

/// Weight matrices and vectors of a model. Q8_0 and F32 tensors are used in place from the
/// mapping; every other type is dequantized once to float32 and owned here.
class WeightStore {
 public:
  explicit WeightStore(const gguf::File& file) : file_(&file) {}

  /// The tensor `name` as a [rows, cols] matrix. Throws kestrel::Error if it is missing or
  /// its shape is not {cols, rows}.
  kernels::Matrix matrix(const std::string& name, size_t rows, size_t cols);
  /// The 1-D tensor `name` of n elements, as float32.
  const float* vector(const std::string& name, size_t n);
  bool has(const std::string& name) const { return file_->find_tensor(name) != nullptr; }
  /// Parameters seen so far.
  size_t n_params() const { return n_params_; }

 private:
  const gguf::TensorInfo& checked(const std::string& name, std::vector<uint64_t> shape);
  const float* dequantized(const gguf::TensorInfo& info);

  const gguf::File* file_;
  std::vector<std::vector<float>> owned_;
  size_t n_params_ = 0;
};

}  // namespace kestrel::model
