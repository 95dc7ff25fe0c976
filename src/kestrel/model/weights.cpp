#include "kestrel/model/weights.h"

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"

namespace kestrel::model {
namespace {

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "{";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "}";
}

}  // namespace

const gguf::TensorInfo& WeightStore::checked(const std::string& name,
                                             std::vector<uint64_t> shape) {
  const gguf::TensorInfo* info = file_->find_tensor(name);
  if (info == nullptr) throw Error("model file has no tensor '" + name + "'");
  if (info->shape != shape) {
    throw Error("tensor '" + name + "' has shape " + shape_string(info->shape) + ", expected " +
                shape_string(shape));
  }
  if (!gguf::is_supported(info->type)) {
    throw Error("tensor '" + name + "' has type " + gguf::tensor_type_name(info->type) +
                ", which Kestrel cannot read yet");
  }
  n_params_ += info->n_elements;
  return *info;
}

const float* WeightStore::dequantized(const gguf::TensorInfo& info) {
  const auto bytes = file_->tensor_data(info);
  if (info.type == gguf::TensorType::kF32) return reinterpret_cast<const float*>(bytes.data());
  auto& out = owned_.emplace_back(info.n_elements);
  gguf::dequantize(info.type, bytes.data(), out.data(), info.n_elements);
  return out.data();
}

kernels::Matrix WeightStore::matrix(const std::string& name, size_t rows, size_t cols) {
  const auto& info = checked(name, {cols, rows});
  kernels::Matrix m;
  m.rows = rows;
  m.cols = cols;
  if (info.type == gguf::TensorType::kQ8_0) {
    m.type = kernels::WeightType::kQ8_0;
    m.data = file_->tensor_data(info).data();
  } else {
    m.type = kernels::WeightType::kF32;
    m.data = dequantized(info);
  }
  return m;
}

const float* WeightStore::vector(const std::string& name, size_t n) {
  return dequantized(checked(name, {n}));
}

}  // namespace kestrel::model
