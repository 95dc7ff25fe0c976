#include "kestrel/model/weights.h"

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/image/int4_tensors.h"
#include "kestrel/image/q8_tensors.h"
#include "kestrel/kernels/registry.h"
#include "kestrel/quant/gguf_convert.h"

namespace kestrel::model {
namespace {

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "{";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "}";
}

template <typename T>
size_t bytes_of(const std::vector<T>& v) {
  return v.size() * sizeof(T);
}

}  // namespace

size_t WeightStore::load_copy_bytes() const {
  size_t n = 0;
  for (const auto& v : owned_) n += bytes_of(v);
  for (const auto& v : owned_16_) n += bytes_of(v);
  for (const auto& v : owned_q8_0_) n += bytes_of(v);
  for (const auto& w : owned_w4_) {
    n += bytes_of(w.qs) + bytes_of(w.scales) + bytes_of(w.mins) + bytes_of(w.scales8) + bytes_of(w.mins8) +
         bytes_of(w.row_scales);
  }
  for (const auto& il : owned_interleaved_) {
    n += bytes_of(il.codes) + bytes_of(il.scales) + bytes_of(il.mins) + bytes_of(il.scales8) + bytes_of(il.mins8) +
         bytes_of(il.row_d) + bytes_of(il.row_m);
  }
  // The int8 copies own their arrays; a view of an image's int8 layout owns its W8A8 copy alone.
  for (const auto& il : owned_interleaved_int8_) n += il.owned_bytes();
  for (const auto& il : owned_interleaved_q8_) n += il.owned_bytes();  // a view of an image: 0
  return n;
}

bool WeightStore::has_matrix(const std::string& name) const {
  return has(name) || image::has_int4(*file_, name) || image::has_q8_layout(*file_, name);
}

void WeightStore::release(const gguf::TensorInfo& info) {
  file_->release(info);
  released_bytes_ += info.n_bytes;
}

void WeightStore::release_image_tensors(const std::string& name) {
  for (const char* suffix : {image::kQ4Suffix, image::kScalesSuffix, image::kMinsSuffix, image::kRowScalesSuffix,
                             image::kInt8CodesSuffix, image::kInt8ScalesSuffix, image::kInt8MinsSuffix,
                             image::kInt8RowScalesSuffix, image::kQ8Int8CodesSuffix, image::kQ8Int8ScalesSuffix}) {
    if (const gguf::TensorInfo* t = file_->find_tensor(name + suffix)) release(*t);
  }
}

void WeightStore::populate_image_layout(const std::string& name) {
  for (const char* suffix : {image::kInt8CodesSuffix, image::kInt8ScalesSuffix, image::kInt8MinsSuffix,
                             image::kInt8RowScalesSuffix, image::kQ8Int8CodesSuffix, image::kQ8Int8ScalesSuffix}) {
    if (const gguf::TensorInfo* t = file_->find_tensor(name + suffix)) file_->populate(*t);
  }
}

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

WeightStore::WeightStore(const gguf::File& file, const LoadOptions& options, ThreadPool& pool)
    : file_(&file), image_(image::read_image_info(file)), options_(options), pool_(&pool) {
  if (image_ && options.precision != Precision::kSource && options.precision != Precision::kAuto &&
      options.precision != image_->precision) {
    throw Error(std::string("this file is a prebuilt ") + quant::precision_name(image_->precision) +
                " Kestrel image; it cannot be loaded as " + quant::precision_name(options.precision));
  }
}

const gguf::TensorInfo& WeightStore::image_tensor(const std::string& name, gguf::TensorType type,
                                                  std::vector<uint64_t> shape) {
  const gguf::TensorInfo* info = file_->find_tensor(name);
  if (info == nullptr) throw Error("image has no tensor '" + name + "'");
  if (info->type != type || info->shape != shape) {
    throw Error("image tensor '" + name + "' has type " + gguf::tensor_type_name(info->type) +
                " and shape " + shape_string(info->shape) + ", expected " +
                gguf::tensor_type_name(type) + " " + shape_string(shape));
  }
  return *info;
}

kernels::Matrix WeightStore::image_matrix(const std::string& name, size_t rows, size_t cols) {
  kernels::Matrix m;
  m.rows = rows;
  m.cols = cols;
  const gguf::TensorInfo* plain = nullptr;
  if (image_->precision == Precision::kW4A16 && !has(name + image::kQ4Suffix) &&
      (plain = file_->find_tensor(name)) != nullptr) {
    // A matrix a --tensor-type override kept at Q8_0 or BF16 (image/tensor_types.h), in place.
    if (plain->type != gguf::TensorType::kQ8_0 && plain->type != gguf::TensorType::kBF16) {
      throw Error("image tensor '" + name + "' has type " + gguf::tensor_type_name(plain->type) +
                  "; a w4a16 image stores layer matrices as INT4, Q8_0 or BF16");
    }
    const auto& t = image_tensor(name, plain->type, {cols, rows});
    if (t.type == gguf::TensorType::kQ8_0 && cols % 32 != 0) {
      throw Error("image tensor '" + name + "': Q8_0 rows of " + std::to_string(cols) + ", not a multiple of 32");
    }
    m.type = t.type == gguf::TensorType::kQ8_0 ? kernels::WeightType::kQ8_0 : kernels::WeightType::kBF16;
    m.data = file_->tensor_data(t).data();
  } else if (image_->precision == Precision::kW4A16) {
    m = image::plain_int4_view(*file_, name, *image_);
    if (m.rows != rows || m.cols != cols) {
      throw Error("image tensor '" + name + image::kQ4Suffix + "' holds " + std::to_string(m.rows) + " x " +
                  std::to_string(m.cols) + ", expected " + std::to_string(rows) + " x " + std::to_string(cols));
    }
  } else {
    const bool fp16 = image_->precision == Precision::kFP16;
    m.type = fp16 ? kernels::WeightType::kF16 : kernels::WeightType::kBF16;
    m.data = file_->tensor_data(image_tensor(name, fp16 ? gguf::TensorType::kF16 : gguf::TensorType::kBF16,
                                             {cols, rows})).data();
  }
  n_params_ += rows * cols;
  return m;
}

bool WeightStore::quantized() const {
  // Only where the layers are quantized (a GGUF's auto form, W4A16) do a Q8_0 matrix and the head
  // take int8 activations: the source form is the float32 parity path, BF16/FP16 the baseline.
  const Precision in_effect = image_ ? image_->precision : options_.precision;
  return in_effect == Precision::kAuto || in_effect == Precision::kW4A16;
}

kernels::Matrix WeightStore::image_int8_layout(const std::string& name, size_t rows, size_t cols) {
  kernels::W4Int8Interleaved view = image::int8_layout_view(*file_, name, *image_);
  if (view.rows != rows || view.cols != cols) {
    throw Error("image tensor '" + name + image::kInt8CodesSuffix + "' holds " + std::to_string(view.rows) + " x " +
                std::to_string(view.cols) + ", expected " + std::to_string(rows) + " x " + std::to_string(cols));
  }
  n_params_ += rows * cols;
  kernels::Matrix m;
  m.type = kernels::WeightType::kW4;
  m.rows = rows;
  m.cols = cols;
  m.group_size = view.group_size;
  m.interleaved_int8 = &view;
  if (kernels::choose_layout(m, kernels::MatrixRole::kLayer, quantized(), options_.decode_activations) ==
      kernels::WeightLayout::kW4Int8Interleaved) {
    // The kernels read the image's pages: no copy (bar the opt-in W8A8 one). The content check
    // dropped them from the page table; mapped again here, the first product does not fault.
    populate_image_layout(name);
    kernels::add_default_w8a8(view, image_->zero_points, pool_);
    m.interleaved_int8 = &owned_interleaved_int8_.emplace_back(std::move(view));
    return m;
  }
  // This run does not take the int8 kernels (bf16 activations, a CPU without SIMD int8): the
  // row-major matrix, de-interleaved once (an owned copy), laid out as a plain image's would be.
  kernels::Matrix rows_m = owned_w4_.emplace_back(kernels::deinterleave_w4_int8(view, image_->zero_points, pool_)).view();
  release_image_tensors(name);
  return laid_out(rows_m, kernels::MatrixRole::kLayer);
}

kernels::Matrix WeightStore::image_q8_layout(const std::string& name, size_t rows, size_t cols) {
  kernels::Q8Interleaved view = image::q8_layout_view(*file_, name, *image_, rows, cols);
  n_params_ += rows * cols;
  kernels::Matrix m;
  m.type = kernels::WeightType::kQ8_0;
  m.rows = rows;
  m.cols = cols;
  if (kernels::choose_layout(m, kernels::MatrixRole::kLayer, quantized(), options_.decode_activations) ==
      kernels::WeightLayout::kQ8_0Interleaved) {
    populate_image_layout(name);  // read in place: no copy
    m.interleaved_q8 = &owned_interleaved_q8_.emplace_back(std::move(view));
    return m;
  }
  // Float activations (bf16, a CPU without SIMD int8): the ggml rows, de-interleaved once (a copy).
  m.data = owned_q8_0_.emplace_back(kernels::deinterleave_q8_0(view, pool_)).data();
  release_image_tensors(name);
  return laid_out(m, kernels::MatrixRole::kLayer);
}

kernels::Matrix WeightStore::laid_out(kernels::Matrix m, kernels::MatrixRole role) {
  using kernels::WeightLayout;
  switch (kernels::choose_layout(m, role, quantized(), options_.decode_activations)) {
    case WeightLayout::kW4Int8Interleaved:
      m.interleaved_int8 = &owned_interleaved_int8_.emplace_back(kernels::interleave_w4_int8(m, pool_));
      break;
    case WeightLayout::kW4Interleaved:
      m.interleaved = &owned_interleaved_.emplace_back(kernels::interleave_w4(m));
      break;
    case WeightLayout::kQ8_0Interleaved:
      m.interleaved_q8 = &owned_interleaved_q8_.emplace_back(kernels::interleave_q8_0(m, pool_));
      break;
    case WeightLayout::kQ8_0Int8Rows:
    case WeightLayout::kW4Int8Rows:
      m.int8_rows = true;
      ++int8_row_matrices_;
      break;
    default:
      break;  // read as stored
  }
  return m;
}

kernels::Matrix WeightStore::with_int8_head(kernels::Matrix head, const std::string& stored_as) {
  if (image_ && !stored_as.empty() && image::has_q8_layout(*file_, stored_as) &&
      kernels::choose_layout(head, kernels::MatrixRole::kHead, quantized(), options_.decode_activations) ==
          kernels::WeightLayout::kQ8_0Interleaved) {
    // The layout the head's int8 kernel reads, stored beside the rows (which the embedding reads):
    // viewed in place, its pages mapped now so that the first token does not fault them in.
    populate_image_layout(stored_as);
    head.interleaved_q8 =
        &owned_interleaved_q8_.emplace_back(image::q8_layout_view(*file_, stored_as, *image_, head.rows, head.cols));
    return head;
  }
  return laid_out(head, kernels::MatrixRole::kHead);
}

kernels::Matrix WeightStore::with_int8_head_rows(kernels::Matrix head) {
  return laid_out(head, kernels::MatrixRole::kHeadInPlace);
}

kernels::Matrix WeightStore::matrix(const std::string& name, size_t rows, size_t cols) {
  if (image_) {
    if (image_->precision == Precision::kW4A16 && image::has_int8_layout(*file_, name)) {
      return image_int8_layout(name, rows, cols);
    }
    if (image_->precision == Precision::kW4A16 && image::has_q8_layout(*file_, name)) {
      return image_q8_layout(name, rows, cols);
    }
    kernels::Matrix m = laid_out(image_matrix(name, rows, cols), kernels::MatrixRole::kLayer);
    // The kernels read the copy alone from now on: the INT4 tensors' pages leave the resident
    // set, so that the loaded model costs its file plus the copy's layout overhead, not both.
    if (m.type == kernels::WeightType::kW4 && (m.interleaved_int8 != nullptr || m.interleaved != nullptr)) {
      release_image_tensors(name);
    }
    return m;
  }
  if (options_.precision == Precision::kSource) return source_matrix(name, rows, cols);
  if (options_.precision == Precision::kAuto) return laid_out(converted(name, rows, cols), kernels::MatrixRole::kLayer);
  const auto& info = checked(name, {cols, rows});
  std::vector<float> dense(info.n_elements);
  gguf::dequantize(info.type, file_->tensor_data(info).data(), dense.data(), info.n_elements);
  if (options_.precision == Precision::kW4A16) {
    owned_w4_.push_back(quant::quantize_w4(dense.data(), rows, cols, options_.group_size, nullptr,
                                                   options_.zero_points, *pool_));
    if (options_.scale_bits == 8) quant::compress_group_params(owned_w4_.back(), dense.data(), nullptr, *pool_);
    return laid_out(owned_w4_.back().view(), kernels::MatrixRole::kLayer);
  }
  const bool fp16 = options_.precision == Precision::kFP16;
  auto& half = owned_16_.emplace_back(dense.size());
  for (size_t i = 0; i < dense.size(); ++i) {
    half[i] = fp16 ? gguf::fp32_to_fp16(dense[i]) : gguf::fp32_to_bf16(dense[i]);
  }
  kernels::Matrix m;
  m.type = fp16 ? kernels::WeightType::kF16 : kernels::WeightType::kBF16;
  m.data = half.data();
  m.rows = rows;
  m.cols = cols;
  return m;
}

kernels::Matrix WeightStore::source_matrix(const std::string& name, size_t rows, size_t cols) {
  if (image_ && image_->precision == Precision::kW4A16 && has(name + image::kQ4Suffix)) {
    return image_matrix(name, rows, cols);  // an INT4 embedding
  }
  if (!image_ && options_.precision == Precision::kAuto) return converted(name, rows, cols);
  return in_place(checked(name, {cols, rows}), rows, cols);
}

kernels::Matrix WeightStore::in_place(const gguf::TensorInfo& info, size_t rows, size_t cols) {
  kernels::Matrix m;
  m.rows = rows;
  m.cols = cols;
  if (info.type == gguf::TensorType::kQ8_0) {
    m.type = kernels::WeightType::kQ8_0;
    m.data = file_->tensor_data(info).data();
  } else if (info.type == gguf::TensorType::kF16) {
    m.type = kernels::WeightType::kF16;
    m.data = file_->tensor_data(info).data();
  } else if (info.type == gguf::TensorType::kBF16) {
    m.type = kernels::WeightType::kBF16;
    m.data = file_->tensor_data(info).data();
  } else {
    m.type = kernels::WeightType::kF32;
    m.data = dequantized(info);
  }
  return m;
}

kernels::Matrix WeightStore::converted(const std::string& name, size_t rows, size_t cols) {
  const auto& info = checked(name, {cols, rows});
  const auto bytes = file_->tensor_data(info);
  switch (quant::kernel_form(info.type)) {
    case quant::KernelForm::kInt4:
      try {
        kernels::Matrix m = owned_w4_.emplace_back(quant::w4_from_gguf(info.type, bytes, rows, cols, *pool_)).view();
        release(info);  // the GGUF's K-quant bytes are read once, here
        return m;
      } catch (const Error&) {
        break;  // a Q4_K parameter past fp16's range: float32, as stored values
      }
    case quant::KernelForm::kQ8_0:
      if (cols % 32 == 0) {
        kernels::Matrix m;
        m.type = kernels::WeightType::kQ8_0;
        m.data = owned_q8_0_.emplace_back(quant::q8_0_from_gguf(info.type, bytes, rows, cols, *pool_)).data();
        release(info);  // converted once, here
        m.rows = rows;
        m.cols = cols;
        return m;
      }
      break;
    case quant::KernelForm::kInPlace:
      break;
  }
  return in_place(info, rows, cols);
}

const float* WeightStore::vector(const std::string& name, size_t n) {
  return dequantized(checked(name, {n}));
}

}  // namespace kestrel::model
