#include "kestrel/image/int4_tensors.h"

#include <cstring>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"

namespace kestrel::image {
namespace {

using gguf::TensorType;

bool ends_with(const std::string& s, const char* suffix) {
  const size_t k = std::strlen(suffix);
  return s.size() > k && s.compare(s.size() - k, k, suffix) == 0;
}

// The tensor base + spec.suffix, checked against spec's type and shape, as a span of T.
template <typename T>
std::span<const T> checked_span(const gguf::File& file, const std::string& base, const Int8LayoutTensor& spec) {
  const std::string name = base + spec.suffix;
  const gguf::TensorInfo* t = file.find_tensor(name);
  if (t == nullptr) throw Error("image has no tensor '" + name + "'");
  if (t->type != spec.type || t->shape != spec.shape) {
    throw Error("image tensor '" + name + "' has type " + gguf::tensor_type_name(t->type) +
                " or a shape other than the int8 layout's (" + gguf::tensor_type_name(spec.type) + ")");
  }
  const auto bytes = file.tensor_data(*t);
  return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
}

// The plain tensors of `base` (".q4", ".scales", ".mins" / ".row_scales") as a matmul.h matrix.
kernels::Matrix plain_rows(const gguf::File& file, const std::string& base, const ImageInfo& info) {
  const auto& q4 = file.tensor(base + kQ4Suffix);
  const auto& sc = file.tensor(base + kScalesSuffix);
  kernels::Matrix m;
  m.type = kernels::WeightType::kW4;
  m.data = file.tensor_data(q4).data();
  m.rows = q4.shape.size() == 2 ? q4.shape[1] : 0;
  m.cols = q4.shape[0] * 2;
  m.group_size = info.group_size;
  const gguf::TensorInfo* mn = file.find_tensor(base + kMinsSuffix);
  if (sc.type == TensorType::kI8) {
    m.scales8 = reinterpret_cast<const uint8_t*>(file.tensor_data(sc).data());
    if (mn == nullptr) throw Error("image tensor " + base + " has 8-bit scales without " + kMinsSuffix);
    m.mins8 = reinterpret_cast<const uint8_t*>(file.tensor_data(*mn).data());
    m.row_scales = reinterpret_cast<const uint16_t*>(file.tensor_data(file.tensor(base + kRowScalesSuffix)).data());
  } else {
    m.scales = reinterpret_cast<const uint16_t*>(file.tensor_data(sc).data());
    m.mins = mn ? reinterpret_cast<const uint16_t*>(file.tensor_data(*mn).data()) : nullptr;
  }
  if (m.group_size == 0 || m.cols % m.group_size != 0 || sc.n_elements * m.group_size != m.rows * m.cols) {
    throw Error("image tensor " + base + ": scales do not match the group size " + std::to_string(m.group_size));
  }
  return m;
}

}  // namespace

std::vector<Int8LayoutTensor> int8_layout_tensors(size_t rows, size_t cols, size_t group_size, int scale_bits,
                                                  bool zero_points) {
  const uint64_t blocks = rows / 16, groups = cols / group_size;
  const TensorType params = scale_bits == 8 ? TensorType::kI8 : TensorType::kF16;
  std::vector<Int8LayoutTensor> out;
  out.push_back({kInt8CodesSuffix, TensorType::kI8, {64, cols / 8, blocks}});
  out.push_back({kInt8ScalesSuffix, params, {16, groups, blocks}});
  if (scale_bits != 8 || zero_points) out.push_back({kInt8MinsSuffix, params, {16, groups, blocks}});
  if (scale_bits == 8) out.push_back({kInt8RowScalesSuffix, TensorType::kF32, {rows, 2}});
  return out;
}

bool has_int8_layout(const gguf::File& file, const std::string& base) {
  return file.find_tensor(base + kInt8CodesSuffix) != nullptr;
}

bool has_int4(const gguf::File& file, const std::string& base) {
  return file.find_tensor(base + kQ4Suffix) != nullptr || has_int8_layout(file, base);
}

bool is_int4_params_tensor(const std::string& name) {
  for (const char* suffix : {kScalesSuffix, kMinsSuffix, kRowScalesSuffix, kInt8ScalesSuffix, kInt8MinsSuffix,
                             kInt8RowScalesSuffix}) {
    if (ends_with(name, suffix)) return true;
  }
  return false;
}

std::string int4_base(const std::string& name) {
  for (const char* suffix : {kQ4Suffix, kInt8CodesSuffix}) {
    if (ends_with(name, suffix)) return name.substr(0, name.size() - std::strlen(suffix));
  }
  return "";
}

kernels::W4Int8Interleaved int8_layout_view(const gguf::File& file, const std::string& base, const ImageInfo& info) {
  if (info.w4_int8_layout == 0) {
    throw Error("image tensor '" + base + kInt8CodesSuffix + "' is in the int8 layout, but the image has no " +
                keys::kW4Int8Layout);
  }
  const auto& codes = file.tensor(base + kInt8CodesSuffix);
  if (codes.shape.size() != 3 || codes.shape[0] != 64) {
    throw Error("image tensor '" + base + kInt8CodesSuffix + "' is not shaped {64, cols/8, rows/16}");
  }
  kernels::W4Int8Interleaved il;
  il.rows = codes.shape[2] * 16;
  il.cols = codes.shape[1] * 8;
  il.group_size = info.group_size;
  if (!kernels::w4_int8_shape_supported(il.rows, il.cols, il.group_size)) {
    throw Error("image tensor '" + base + "': " + std::to_string(il.rows) + " x " + std::to_string(il.cols) +
                " in groups of " + std::to_string(il.group_size) + " cannot be in the int8 layout");
  }
  for (const Int8LayoutTensor& t :
       int8_layout_tensors(il.rows, il.cols, il.group_size, info.scale_bits, info.zero_points)) {
    const std::string suffix = t.suffix;
    if (suffix == kInt8CodesSuffix) {
      il.codes = checked_span<uint8_t>(file, base, t);
    } else if (suffix == kInt8ScalesSuffix && t.type == TensorType::kF16) {
      il.scales = checked_span<uint16_t>(file, base, t);
    } else if (suffix == kInt8MinsSuffix && t.type == TensorType::kF16) {
      il.mins = checked_span<uint16_t>(file, base, t);
    } else if (suffix == kInt8ScalesSuffix) {
      il.scales8 = checked_span<uint8_t>(file, base, t);
    } else if (suffix == kInt8MinsSuffix) {
      il.mins8 = checked_span<uint8_t>(file, base, t);
    } else {
      const std::span<const float> dm = checked_span<float>(file, base, t);
      il.row_d = dm.first(il.rows);
      il.row_m = dm.last(il.rows);
    }
  }
  kernels::check_w4_int8_layout(il);
  return il;
}

kernels::Matrix int4_rows(const gguf::File& file, const std::string& base, const ImageInfo& info,
                          quant::W4Matrix& owned, ThreadPool* pool) {
  if (!has_int8_layout(file, base)) return plain_rows(file, base, info);
  owned = kernels::deinterleave_w4_int8(int8_layout_view(file, base, info), info.zero_points, pool);
  return owned.view();
}

}  // namespace kestrel::image
