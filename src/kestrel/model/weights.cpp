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

Precision parse_precision(const std::string& name) {
  if (name == "source") return Precision::kSource;
  if (name == "w4a16") return Precision::kW4A16;
  if (name == "bf16") return Precision::kBF16;
  throw Error("unknown precision '" + name + "' (expected source, w4a16 or bf16)");
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kSource: return "source";
    case Precision::kW4A16: return "w4a16";
    case Precision::kBF16: return "bf16";
  }
  return "?";
}

kernels::Matrix WeightStore::matrix(const std::string& name, size_t rows, size_t cols) {
  if (options_.precision == Precision::kSource) return source_matrix(name, rows, cols);
  const auto& info = checked(name, {cols, rows});
  std::vector<float> dense(info.n_elements);
  gguf::dequantize(info.type, file_->tensor_data(info).data(), dense.data(), info.n_elements);
  if (options_.precision == Precision::kW4A16) {
    owned_w4_.push_back(quant::quantize_w4(dense.data(), rows, cols, options_.group_size, nullptr, *pool_));
    return owned_w4_.back().view();
  }
  auto& bf16 = owned_16_.emplace_back(dense.size());
  for (size_t i = 0; i < dense.size(); ++i) bf16[i] = gguf::fp32_to_bf16(dense[i]);
  kernels::Matrix m;
  m.type = kernels::WeightType::kBF16;
  m.data = bf16.data();
  m.rows = rows;
  m.cols = cols;
  return m;
}

kernels::Matrix WeightStore::source_matrix(const std::string& name, size_t rows, size_t cols) {
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
