#include "kestrel/image/auto_image.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <system_error>
#include <vector>

#include "kestrel/formats/dequant.h"
#include "kestrel/formats/gguf_writer.h"
#include "kestrel/image/image.h"
#include "kestrel/image/image_writer.h"
#include "kestrel/image/int4_tensors.h"
#include "kestrel/image/q8_tensors.h"
#include "kestrel/image/tensor_types.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/quant/gguf_convert.h"

namespace kestrel::image {
namespace {

using gguf::TensorType;

constexpr size_t kGroup = 32;  // the auto form's INT4 groups (quant::w4_from_gguf)

// What a source tensor becomes.
enum class Form {
  kInt4Layout,  // INT4, int8 layout (NAME.q4i8*)
  kInt4Plain,   // INT4, plain (NAME.q4, .scales, .mins)
  kQ8Layout,    // Q8_0, int8 layout (NAME.q8i*)
  kQ8Rows,      // Q8_0 rows, converted from another quantized type
  kCopy,        // as stored
  kF32,         // float32 (vectors)
};

Form form_of(const gguf::TensorInfo& t) {
  if (!gguf::is_supported(t.type)) {
    throw NotCacheable("tensor '" + t.name + "' has type " + gguf::tensor_type_name(t.type) +
                       ", which Kestrel cannot read");
  }
  if (t.shape.size() != 2) return Form::kF32;
  const uint64_t cols = t.shape[0], rows = t.shape[1];
  const quant::KernelForm kf = quant::kernel_form(t.type);
  if (is_layer_matrix(t)) {
    if (kf == quant::KernelForm::kInt4) {
      return kernels::w4_int8_shape_supported(rows, cols, kGroup) ? Form::kInt4Layout : Form::kInt4Plain;
    }
    if ((kf == quant::KernelForm::kQ8_0 || t.type == TensorType::kQ8_0) && cols % 32 == 0) return Form::kQ8Layout;
    if (t.type == TensorType::kBF16) return Form::kCopy;
    throw NotCacheable("layer matrix '" + t.name + "' (" + gguf::tensor_type_name(t.type) +
                       ") runs in a form an image does not hold");
  }
  if (kf == quant::KernelForm::kInt4) return Form::kInt4Plain;
  if (kf == quant::KernelForm::kQ8_0) {
    if (cols % 32 != 0) throw NotCacheable("tensor '" + t.name + "' has rows of " + std::to_string(cols));
    return Form::kQ8Rows;
  }
  return Form::kCopy;
}

// Writes the Q8_0 int8 layout (image/q8_tensors.h) of the [rows, cols] Q8_0 matrix `q8`.
void write_q8_layout(gguf::Writer& w, const std::byte* q8, size_t rows, size_t cols, ThreadPool& pool) {
  kernels::Matrix m;
  m.type = kernels::WeightType::kQ8_0;
  m.data = q8;
  m.rows = rows;
  m.cols = cols;
  const kernels::Q8Interleaved il = kernels::interleave_q8_0(m, &pool);
  w.write(as_bytes(il.codes.data(), il.codes.size()));
  w.write(as_bytes(il.scales.data(), il.scales.size() * sizeof(float)));
}

// `head`: the output head's tensor (output.weight, else the tied token_embd.weight) in Q8_0 rows,
// whose int8 kernel reads the Q8_0 int8 layout: that layout is stored after its rows (which the
// embedding reads by token) and viewed in place at load (model::WeightStore::with_int8_head).
void declare(gguf::Writer& w, const gguf::TensorInfo& t, Form f, bool zero_points, bool head) {
  const uint64_t cols = t.shape.empty() ? 0 : t.shape[0], rows = t.shape.size() == 2 ? t.shape[1] : 0;
  switch (f) {
    case Form::kInt4Layout:
      for (const Int8LayoutTensor& l : int8_layout_tensors(rows, cols, kGroup, 16, zero_points)) {
        w.add_tensor(t.name + l.suffix, l.type, l.shape);
      }
      break;
    case Form::kInt4Plain:
      w.add_tensor(t.name + kQ4Suffix, TensorType::kI8, {cols / 2, rows});
      w.add_tensor(t.name + kScalesSuffix, TensorType::kF16, {cols / kGroup, rows});
      if (zero_points) w.add_tensor(t.name + kMinsSuffix, TensorType::kF16, {cols / kGroup, rows});
      break;
    case Form::kQ8Layout:
      for (const Int8LayoutTensor& l : q8_layout_tensors(rows, cols)) w.add_tensor(t.name + l.suffix, l.type, l.shape);
      break;
    case Form::kQ8Rows: w.add_tensor(t.name, TensorType::kQ8_0, t.shape); break;
    case Form::kCopy: w.add_tensor(t.name, t.type, t.shape); break;
    case Form::kF32: w.add_tensor(t.name, TensorType::kF32, t.shape); break;
  }
  if (head) {
    for (const Int8LayoutTensor& l : q8_layout_tensors(rows, cols)) w.add_tensor(t.name + l.suffix, l.type, l.shape);
  }
}

quant::W4Matrix int4_of(const gguf::TensorInfo& t, std::span<const std::byte> data, ThreadPool& pool) {
  try {
    return quant::w4_from_gguf(t.type, data, t.shape[1], t.shape[0], pool);
  } catch (const Error& e) {
    // The load runs such a tensor as float32 (WeightStore::converted).
    throw NotCacheable("tensor '" + t.name + "': " + e.what());
  }
}

void write_tensor(gguf::Writer& w, const gguf::TensorInfo& t, std::span<const std::byte> data, Form f, bool head,
                  ThreadPool& pool) {
  const size_t cols = t.shape.empty() ? 0 : t.shape[0], rows = t.shape.size() == 2 ? t.shape[1] : 0;
  switch (f) {
    case Form::kInt4Layout: write_int8_layout(w, int4_of(t, data, pool), pool); break;
    case Form::kInt4Plain: {
      const quant::W4Matrix q = int4_of(t, data, pool);
      w.write(as_bytes(q.qs.data(), q.qs.size()));
      w.write(as_bytes(q.scales.data(), q.scales.size() * sizeof(uint16_t)));
      w.write(as_bytes(q.mins.data(), q.mins.size() * sizeof(uint16_t)));
      break;
    }
    case Form::kQ8Layout:
    case Form::kQ8Rows:
    case Form::kCopy: {
      std::vector<std::byte> converted;
      if (f != Form::kCopy && t.type != TensorType::kQ8_0) converted = quant::q8_0_from_gguf(t.type, data, rows, cols, pool);
      const std::span<const std::byte> q8 = converted.empty() ? data : std::span<const std::byte>(converted);
      if (f != Form::kQ8Layout) w.write(q8);  // the rows (as stored, or Q8_0 converted)
      if (f == Form::kQ8Layout || head) write_q8_layout(w, q8.data(), rows, cols, pool);
      break;
    }
    case Form::kF32: write_converted(w, t, data, TensorType::kF32); break;
  }
}

}  // namespace

BuildReport build_auto_image(const std::filesystem::path& source, const std::filesystem::path& out, ThreadPool& pool) {
  const auto t0 = std::chrono::steady_clock::now();
  const gguf::File src = gguf::File::open(source);
  check_not_an_image(src, source);

  // Plan: every tensor's form, and one kind of INT4 groups (an image has one kZeroPoints).
  std::vector<Form> forms;
  bool symmetric = false, affine = false;
  const gguf::TensorInfo* embedding = nullptr;
  for (const auto& t : src.tensors()) {
    const Form f = form_of(t);
    forms.push_back(f);
    if (f == Form::kInt4Layout || f == Form::kInt4Plain) (t.type == TensorType::kQ4_0 ? symmetric : affine) = true;
    if (t.name == "token_embd.weight") embedding = &t;
  }
  // The output head (output.weight, else the tied embedding) in Q8_0 rows: its layout too.
  const gguf::TensorInfo* head = src.find_tensor("output.weight");
  if (head == nullptr) head = embedding;
  std::vector<char> heads(forms.size(), 0);
  if (head != nullptr && head->shape.size() == 2 && head->shape[0] % 32 == 0) {
    const size_t i = static_cast<size_t>(head - src.tensors().data());
    heads[i] = forms[i] == Form::kQ8Rows || (forms[i] == Form::kCopy && head->type == TensorType::kQ8_0);
  }
  if (symmetric && affine) {
    throw NotCacheable("the file mixes symmetric (Q4_0) and affine (Q4_1, Q4_K) 4-bit tensors");
  }
  const bool zero_points = !symmetric;

  BuildReport report;
  report.source_bytes = src.file_size();
  report.source_sha256 = sha256_file(source);
  std::filesystem::path partial = out;
  partial += ".partial";
  try {
    gguf::Writer w(partial, kAlignment);
    add_source_metadata(w, src);
    w.add_uint32(keys::kFormatVersion, kFormatVersion);
    w.add_string(keys::kPrecision, quant::precision_name(quant::Precision::kW4A16));
    w.add_uint32(keys::kGroupSize, static_cast<uint32_t>(kGroup));
    w.add_string(keys::kQuantMethod, kAutoQuantMethod);
    w.add_uint32(keys::kZeroPoints, zero_points ? 1 : 0);
    if (embedding != nullptr) {
      const Form f = forms[static_cast<size_t>(embedding - src.tensors().data())];
      w.add_string(keys::kEmbeddingType, f == Form::kInt4Plain ? "INT4"
                                         : f == Form::kQ8Rows  ? "Q8_0"
                                                               : gguf::tensor_type_name(embedding->type));
    }
    const auto any = [&](Form f) { return std::find(forms.begin(), forms.end(), f) != forms.end(); };
    if (any(Form::kInt4Layout)) w.add_uint32(keys::kW4Int8Layout, kW4Int8LayoutVersion);
    if (any(Form::kQ8Layout) || std::find(heads.begin(), heads.end(), 1) != heads.end()) {
      w.add_uint32(keys::kQ8Int8Layout, kQ8Int8LayoutVersion);
    }
    w.add_string(keys::kKestrelVersion, KESTREL_VERSION);
    w.add_uint32(keys::kAutoVersion, kAutoImageVersion);
    w.add_string(keys::kBuildDate, utc_now());
    w.add_string(keys::kSourceFile, source.filename().string());
    w.add_string(keys::kSourceSha256, report.source_sha256);
    w.add_string(keys::kCalibrationSha256, "");
    w.add(keys::kSeed, gguf::Value{gguf::ValueType::kUint64, uint64_t{0}});
    w.add_string(keys::kLicenseText, license_text(source, {}));
    w.add_placeholder_u64(keys::kContentHash);
    const auto& tensors = src.tensors();
    for (size_t i = 0; i < tensors.size(); ++i) declare(w, tensors[i], forms[i], zero_points, heads[i] != 0);
    w.begin_data();
    for (size_t i = 0; i < tensors.size(); ++i) {
      write_tensor(w, tensors[i], src.tensor_data(tensors[i]), forms[i], heads[i] != 0, pool);
      src.release(tensors[i]);  // read once: the conversion's resident set stays near one tensor
    }
    w.patch(keys::kContentHash, w.content_hash(keys::kContentHash));
    w.finish();
    std::filesystem::rename(partial, out);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(partial, ec);
    throw;
  }
  report.n_tensors = src.tensors().size();
  report.image_bytes = std::filesystem::file_size(out);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace kestrel::image
