// An image's INT4 matrices, whichever of its two layouts holds them (image.h): the plain tensors
// (".q4", ".scales", ...: matmul.h's row-major kW4) or the int8 layout (".q4i8", ...:
// kernels::W4Int8Interleaved's, which `kestrel build` writes for the layer matrices the int8
// kernels can run). The loader, `kestrel export` and `kestrel inspect` read them through this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/image/image.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/quant/w4.h"

namespace kestrel::image {

/// One tensor of an INT4 matrix in the int8 layout: the name's suffix, type and GGUF shape.
struct Int8LayoutTensor {
  const char* suffix;
  gguf::TensorType type;
  std::vector<uint64_t> shape;
};

/// The tensors of a [rows, cols] INT4 matrix in the int8 layout, in the order an image stores
/// them (image.h's kInt8*Suffix): codes, scales, mins (16-bit parameters always; 8-bit with zero
/// points) and, for 8-bit parameters, the row scales. Requires
/// kernels::w4_int8_shape_supported(rows, cols, group_size).
std::vector<Int8LayoutTensor> int8_layout_tensors(size_t rows, size_t cols, size_t group_size, int scale_bits,
                                                  bool zero_points);

/// Whether `file` stores the INT4 matrix `base` (e.g. "blk.0.attn_q.weight") in the int8 layout.
bool has_int8_layout(const gguf::File& file, const std::string& base);

/// Whether `file` stores `base` as an INT4 matrix in either layout.
bool has_int4(const gguf::File& file, const std::string& base);

/// Whether a tensor name is one of an INT4 matrix's tensors other than its codes (the group
/// parameters of either layout): readers that walk the tensors skip these.
bool is_int4_params_tensor(const std::string& name);

/// `name` without its INT4 codes suffix (".q4" or ".q4i8") when it has one; "" otherwise.
std::string int4_base(const std::string& name);

/// The plain INT4 tensors of `base` (".q4" codes, ".scales", and ".mins" / ".row_scales" as the
/// image's header says: ImageInfo::scale_bits, zero_points, group_size) as a view of `file`'s
/// mapped tensors: matmul.h's row-major kW4 matrix, its shape read from the codes tensor
/// [cols / 2, rows]. Throws kestrel::Error naming the tensor when one is missing or has another
/// type or shape, or when the rows are not whole groups.
kernels::Matrix plain_int4_view(const gguf::File& file, const std::string& base, const ImageInfo& info);

/// The int8 layout of `base` as a view of `file`'s mapped tensors (no copy; owned stays null),
/// its shape read from the codes tensor. Throws kestrel::Error where the image's keys do not
/// announce the layout (keys::kW4Int8Layout) or a tensor is missing or has another type or
/// shape than int8_layout_tensors gives (kernels::check_w4_int8_layout).
kernels::W4Int8Interleaved int8_layout_view(const gguf::File& file, const std::string& base, const ImageInfo& info);

/// The INT4 matrix `base` in matmul.h's row-major kW4 layout: the plain tensors in place, or the
/// int8 layout de-interleaved into `owned` (kernels::deinterleave_w4_int8: the same codes and
/// parameters bit for bit). Throws kestrel::Error when neither is there.
kernels::Matrix int4_rows(const gguf::File& file, const std::string& base, const ImageInfo& info,
                          quant::W4Matrix& owned, ThreadPool* pool = nullptr);

}  // namespace kestrel::image
