// An image's Q8_0 layer matrices stored in the int8 kernel's layout (image.h's kQ8Int8*Suffix
// tensors: kernels::Q8Interleaved, gemv_q8_interleaved.h), which the GGUF image cache writes
// (image/auto_image.h): the loader views them in place where the int8 kernel runs them.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kestrel/formats/gguf.h"
#include "kestrel/image/image.h"
#include "kestrel/image/int4_tensors.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"

namespace kestrel::image {

/// The two tensors of a [rows, cols] Q8_0 matrix in the int8 layout (cols a multiple of 32), in
/// the order an image stores them: codes (I8 {64, cols/4, padded_rows/16}) and float32 block
/// scales (F32 {16, cols/32, padded_rows/16}), padded_rows = rows rounded up to 16.
std::vector<Int8LayoutTensor> q8_layout_tensors(size_t rows, size_t cols);

/// Whether `file` stores the Q8_0 matrix `base` (e.g. "blk.0.attn_q.weight") in the int8 layout.
bool has_q8_layout(const gguf::File& file, const std::string& base);

/// The layout of the [rows, cols] matrix `base` as a view of `file`'s mapped tensors (no copy;
/// owned stays null). Throws kestrel::Error where the image's keys do not announce the layout
/// (keys::kQ8Int8Layout), a tensor is missing or has another type or shape than
/// q8_layout_tensors(rows, cols) gives.
kernels::Q8Interleaved q8_layout_view(const gguf::File& file, const std::string& base, const ImageInfo& info,
                                      size_t rows, size_t cols);

}  // namespace kestrel::image
