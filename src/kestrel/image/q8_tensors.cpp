#include "kestrel/image/q8_tensors.h"

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"

namespace kestrel::image {

std::vector<Int8LayoutTensor> q8_layout_tensors(size_t rows, size_t cols) {
  const uint64_t blocks = (rows + 15) / 16;
  return {{kQ8Int8CodesSuffix, gguf::TensorType::kI8, {64, cols / 4, blocks}},
          {kQ8Int8ScalesSuffix, gguf::TensorType::kF32, {16, cols / 32, blocks}}};
}

bool has_q8_layout(const gguf::File& file, const std::string& base) {
  return file.find_tensor(base + kQ8Int8CodesSuffix) != nullptr;
}

kernels::Q8Interleaved q8_layout_view(const gguf::File& file, const std::string& base, const ImageInfo& info,
                                      size_t rows, size_t cols) {
  if (info.q8_int8_layout == 0) {
    throw Error("image tensor '" + base + kQ8Int8CodesSuffix + "' is in the Q8_0 int8 layout, but the image has no " +
                keys::kQ8Int8Layout);
  }
  if (cols == 0 || cols % 32 != 0) {
    throw Error("image tensor '" + base + "': rows of " + std::to_string(cols) + " cannot be in the Q8_0 int8 layout");
  }
  kernels::Q8Interleaved il;
  il.rows = rows;
  il.cols = cols;
  for (const Int8LayoutTensor& spec : q8_layout_tensors(rows, cols)) {
    const std::string name = base + spec.suffix;
    const gguf::TensorInfo* t = file.find_tensor(name);
    if (t == nullptr) throw Error("image has no tensor '" + name + "'");
    if (t->type != spec.type || t->shape != spec.shape) {
      throw Error("image tensor '" + name + "' has type " + gguf::tensor_type_name(t->type) +
                  " or a shape other than the Q8_0 int8 layout's of " + std::to_string(rows) + " x " +
                  std::to_string(cols));
    }
    const auto bytes = file.tensor_data(*t);
    if (spec.type == gguf::TensorType::kI8) {
      il.codes = {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
    } else {
      il.scales = {reinterpret_cast<const float*>(bytes.data()), bytes.size() / sizeof(float)};
    }
  }
  kernels::check_q8_interleaved(il);
  return il;
}

}  // namespace kestrel::image
