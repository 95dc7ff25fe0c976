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

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The tensor `name`, checked to have `type` and GGUF `shape`, as a span of T. Both of an INT4
// matrix's layouts read their tensors through this.
template <typename T>
std::span<const T> checked_span(const gguf::File& file, const std::string& name, TensorType type,
                                const std::vector<uint64_t>& shape) {
  const gguf::TensorInfo* t = file.find_tensor(name);
  if (t == nullptr) throw Error("image has no tensor '" + name + "'");
  if (t->type != type || t->shape != shape) {
    throw Error("image tensor '" + name + "' has type " + gguf::tensor_type_name(t->type) + " and shape " +
                shape_string(t->shape) + ", expected " + gguf::tensor_type_name(type) + " " + shape_string(shape));
  }
  const auto bytes = file.tensor_data(*t);
  return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
}

// The int8 layout's tensor base + spec.suffix, as checked_span.
template <typename T>
std::span<const T> checked_span(const gguf::File& file, const std::string& base, const Int8LayoutTensor& spec) {
  return checked_span<T>(file, base + spec.suffix, spec.type, spec.shape);
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

kernels::Matrix plain_int4_view(const gguf::File& file, const std::string& base, const ImageInfo& info) {
  const std::string codes = base + kQ4Suffix;
  const gguf::TensorInfo* q = file.find_tensor(codes);
  if (q == nullptr) throw Error("image has no tensor '" + codes + "'");
  if (q->shape.size() != 2) throw Error("image tensor '" + codes + "' is not a matrix");
  const size_t rows = q->shape[1], cols = 2 * q->shape[0], g = info.group_size;
  if (g == 0 || cols % g != 0) {
    throw Error("image tensor '" + base + "': rows of " + std::to_string(cols) + " are not a multiple of the group size " +
                std::to_string(g));
  }
  kernels::Matrix m;
  m.type = kernels::WeightType::kW4;
  m.rows = rows;
  m.cols = cols;
  m.group_size = g;
  m.data = checked_span<uint8_t>(file, codes, TensorType::kI8, {cols / 2, rows}).data();
  const std::vector<uint64_t> params = {cols / g, rows};
  if (info.scale_bits == 8) {
    m.scales8 = checked_span<uint8_t>(file, base + kScalesSuffix, TensorType::kI8, params).data();
    m.mins8 = checked_span<uint8_t>(file, base + kMinsSuffix, TensorType::kI8, params).data();
    m.row_scales = checked_span<uint16_t>(file, base + kRowScalesSuffix, TensorType::kF16, {2, rows}).data();
  } else {
    m.scales = checked_span<uint16_t>(file, base + kScalesSuffix, TensorType::kF16, params).data();
    if (info.zero_points) m.mins = checked_span<uint16_t>(file, base + kMinsSuffix, TensorType::kF16, params).data();
  }
  return m;
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
  if (!has_int8_layout(file, base)) return plain_int4_view(file, base, info);
  owned = kernels::deinterleave_w4_int8(int8_layout_view(file, base, info), info.zero_points, pool);
  return owned.view();
}

}  // namespace kestrel::image
