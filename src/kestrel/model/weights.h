// Turning GGUF tensors into the weight forms the kernels take.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/image/image.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/gemv_w4_interleaved.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/kernels/registry.h"
#include "kestrel/model/kv_cache.h"
#include "kestrel/quant/precision.h"
#include "kestrel/quant/w4.h"

namespace kestrel::model {

using quant::Precision;

struct LoadOptions {
  Precision precision = Precision::kSource;
  size_t group_size = 32;  // kW4A16: weights per fp16 scale
  bool zero_points = true; // kW4A16: affine groups (scale and min) instead of symmetric
  int scale_bits = 16;     // kW4A16: 16, or 8 (quant::compress_group_params; affine groups)
  /// INT4 layers: the activations of decode products (1-7 tokens), kernels::w4_int8_chosen.
  kernels::DecodeActivations decode_activations = kernels::DecodeActivations::kAuto;
  /// The element types of every KV cache the model allocates (`--cache-type-k` / `-v`).
  KvTypes kv_types{};
};

/// Weight matrices and vectors of a model, converted to the precision asked for. A Kestrel
/// image (image/image.h) is used in place, in the precision it was built with.
class WeightStore {
 public:
  /// Throws kestrel::Error when `file` is an image and options ask for another precision.
  WeightStore(const gguf::File& file, const LoadOptions& options, ThreadPool& pool);

  /// The layer matrix `name` as [rows, cols] in the store's precision. Throws kestrel::Error
  /// if it is missing or its shape is not {cols, rows}.
  kernels::Matrix matrix(const std::string& name, size_t rows, size_t cols);
  /// The same, in the source form (F32/Q8_0 in place, else float32; with Precision::kAuto the
  /// kernel form quant/gguf_convert.h gives it): the embedding.
  kernels::Matrix source_matrix(const std::string& name, size_t rows, size_t cols);
  /// The 1-D tensor `name` of n elements, as float32.
  const float* vector(const std::string& name, size_t n);
  /// `head` (the output head's matrix) in the layout kernels::choose_layout gives a dense head
  /// (MatrixRole::kHead): with int8 activations where options and CPU choose them and the layers
  /// are quantized (a GGUF's auto form, W4A16), a Q8_0 head on an interleaved copy
  /// (gemv_q8_interleaved.h), an INT4 one (an image built with --embedding int4) from its rows as
  /// stored (gemv_w4_rows.h: its copy would be 335 MB for Gemma 4's head); else as it is.
  /// An image that also stores the head (the tensor `stored_as`, e.g. "token_embd.weight") in
  /// the Q8_0 int8 layout (image/q8_tensors.h: the GGUF image cache's images) has that layout
  /// viewed in place instead of copied.
  kernels::Matrix with_int8_head(kernels::Matrix head, const std::string& stored_as = "");
  /// The same for a FlashHead image's head (MatrixRole::kHeadInPlace), never copied (~190 MB for
  /// Gemma 3's Q8_0 head of 262,144 rows): its products, FlashHead's stage 2 and the dense head
  /// alike, run on the rows as stored (kernels::Matrix::int8_rows: gemv_q8_rows.h,
  /// gemv_w4_rows.h), with the copy's bits on 32-column blocks (an INT4 head with 8-bit
  /// parameters rounds per 32 columns here, where a copy would take superblocks of 128:
  /// gemv_w4_int8.h).
  kernels::Matrix with_int8_head_rows(kernels::Matrix head);
  bool has(const std::string& name) const { return file_->find_tensor(name) != nullptr; }
  /// Whether the file holds the layer matrix `name` in any form: as stored under its name, or
  /// an image's INT4 tensors in either layout (image/int4_tensors.h).
  bool has_matrix(const std::string& name) const;
  /// Parameters seen so far.
  size_t n_params() const { return n_params_; }
  /// Matrices given int8 activations so far: an int8 copy (INT4 and Q8_0) or int8_rows.
  size_t int8_matrices() const {
    return owned_interleaved_int8_.size() + owned_interleaved_q8_.size() + int8_row_matrices_;
  }
  /// Bytes of the copies made at load (kernel layouts, conversions, float32 vectors): the
  /// memory a loaded model holds beyond the file's mapped pages.
  size_t load_copy_bytes() const;
  /// Bytes of the file's tensors whose pages were dropped from the resident set after a load copy
  /// replaced them (gguf::File::release; a later read faults them in again from the file).
  size_t released_bytes() const { return released_bytes_; }

 private:
  const gguf::TensorInfo& checked(const std::string& name, std::vector<uint64_t> shape);
  const float* dequantized(const gguf::TensorInfo& info);
  // A checked GGUF tensor as stored where a kernel takes it (F32, Q8_0, F16, BF16), else float32.
  kernels::Matrix in_place(const gguf::TensorInfo& info, size_t rows, size_t cols);
  // A GGUF tensor in its kernel form (Precision::kAuto, quant/gguf_convert.h).
  kernels::Matrix converted(const std::string& name, size_t rows, size_t cols);

  kernels::Matrix image_matrix(const std::string& name, size_t rows, size_t cols);
  // An INT4 layer matrix the image stores in the int8 layout (image.h): viewed in place where the
  // registry keeps that layout (no copy), else de-interleaved to the row-major matrix (an owned
  // copy, counted in load_copy_bytes) and laid out as a plain image's would be.
  kernels::Matrix image_int8_layout(const std::string& name, size_t rows, size_t cols);
  // Whether the layers are quantized (a GGUF's auto form, a W4A16 image): what choose_layout asks.
  bool quantized() const;
  // m in the layout kernels::choose_layout gives it for `role` (registry.h), its copy made and
  // kept here where that layout is one.
  kernels::Matrix laid_out(kernels::Matrix m, kernels::MatrixRole role);
  const gguf::TensorInfo& image_tensor(const std::string& name, gguf::TensorType type,
                                       std::vector<uint64_t> shape);
  // Drops the pages of the file's tensor from the resident set (a load copy replaced it).
  void release(const gguf::TensorInfo& info);
  // A Q8_0 layer matrix the image stores in the int8 layout (image/q8_tensors.h): viewed in
  // place where the registry gives it the interleaved layout (no copy), else de-interleaved to
  // the ggml rows (an owned copy, counted in load_copy_bytes).
  kernels::Matrix image_q8_layout(const std::string& name, size_t rows, size_t cols);
  // release() of an image matrix's stored tensors (INT4 codes, group parameters, row scales; the
  // Q8_0 layout) once a copy replaces them: no kernel reads them after that.
  void release_image_tensors(const std::string& name);
  // File::populate of an image matrix's int8-layout tensors (INT4 or Q8_0), which the kernels
  // read in place.
  void populate_image_layout(const std::string& name);

  const gguf::File* file_;
  std::optional<image::ImageInfo> image_;
  LoadOptions options_;
  ThreadPool* pool_;
  std::deque<std::vector<float>> owned_;
  std::deque<std::vector<uint16_t>> owned_16_;
  std::deque<std::vector<std::byte>> owned_q8_0_;
  std::deque<quant::W4Matrix> owned_w4_;
  std::deque<kernels::W4Interleaved> owned_interleaved_;
  // int8 copies, and views of an image's int8 layout (whose `owned` is null or its W8A8 copy).
  std::deque<kernels::W4Int8Interleaved> owned_interleaved_int8_;
  std::deque<kernels::Q8Interleaved> owned_interleaved_q8_;
  size_t int8_row_matrices_ = 0;  // heads given int8_rows (with_int8_head_rows)
  size_t n_params_ = 0;
  size_t released_bytes_ = 0;
};

}  // namespace kestrel::model
