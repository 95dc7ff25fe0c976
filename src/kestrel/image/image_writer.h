// What the image writers share (image/builder.cpp's `kestrel build`, image/auto_image.cpp's GGUF
// image cache): the source's metadata and Kestrel's provenance keys, licence text, and tensors
// written in the layouts the kernels read.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/formats/gguf_writer.h"
#include "kestrel/quant/w4.h"

namespace kestrel::image {

/// `n` bytes at `data`, for gguf::Writer::write.
std::span<const std::byte> as_bytes(const void* data, size_t n);

/// The current time, UTC, ISO 8601 (keys::kBuildDate).
std::string utc_now();

/// The licence and NOTICE files to carry into an image (keys::kLicenseText): `extra`, then the
/// files named LICENSE*, LICENCE*, NOTICE*, COPYING* or *TERMS* next to `source`, each headed
/// "==> name <==". Throws kestrel::Error for a file that cannot be read or is not UTF-8.
std::string license_text(const std::filesystem::path& source, const std::vector<std::filesystem::path>& extra);

/// Adds every metadata entry of `src` to `w` in file order except general.alignment (the writer's
/// own) and Kestrel's keys (kestrel.*: an image's are its own, never inherited).
void add_source_metadata(gguf::Writer& w, const gguf::File& src);

/// Writes the INT4 matrix `q` in the int8 layout (image.h's kInt8*Suffix tensors, in the order
/// int8_layout_tensors gives): kernels::interleave_w4_int8_layout of the row-major matrix.
void write_int8_layout(gguf::Writer& w, const quant::W4Matrix& q, ThreadPool& pool);

/// Writes a tensor's values (`bytes`, in t.type) as `type` (F32, F16 or BF16), a block of rows
/// at a time.
void write_converted(gguf::Writer& w, const gguf::TensorInfo& t, std::span<const std::byte> bytes,
                     gguf::TensorType type);

}  // namespace kestrel::image
