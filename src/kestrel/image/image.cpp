#include "kestrel/image/image.h"

#include <cinttypes>
#include <cstdio>

#include "kestrel/base/error.h"
#include "kestrel/formats/gguf_writer.h"

namespace kestrel::image {

std::optional<ImageInfo> read_image_info(const gguf::File& file) {
  const auto version = file.find_uint(keys::kFormatVersion);
  if (!version) return std::nullopt;
  if (*version != kFormatVersion) {
    throw Error("Kestrel image format version " + std::to_string(*version) +
                " is not the version this Kestrel reads (" + std::to_string(kFormatVersion) +
                "); rebuild the image with this Kestrel's `kestrel build`");
  }
  ImageInfo info;
  info.format_version = static_cast<uint32_t>(*version);
  info.precision = quant::parse_precision(file.get_string(keys::kPrecision));
  if (info.precision == quant::Precision::kSource || info.precision == quant::Precision::kAuto) {
    throw Error("image: bad " + std::string(keys::kPrecision) + " '" + file.get_string(keys::kPrecision) + "'");
  }
  if (info.precision == quant::Precision::kW4A16) {
    info.group_size = file.get_uint(keys::kGroupSize);
    if (info.group_size == 0 || info.group_size % 32 != 0) {
      throw Error("image: bad " + std::string(keys::kGroupSize) + " " + std::to_string(info.group_size));
    }
    info.zero_points = file.find_uint(keys::kZeroPoints).value_or(0) != 0;
    const uint64_t bits = file.find_uint(keys::kScaleBits).value_or(16);
    if (bits != 16 && (bits != 8 || !info.zero_points)) {
      throw Error("image: bad " + std::string(keys::kScaleBits) + " " + std::to_string(bits) +
                  " (16, or 8 with zero points)");
    }
    info.scale_bits = static_cast<int>(bits);
    const uint64_t layout = file.find_uint(keys::kW4Int8Layout).value_or(0);
    if (layout > kW4Int8LayoutVersion) {
      throw Error("image: int8 layout version " + std::to_string(layout) + " (" + keys::kW4Int8Layout +
                  ") is not the version this Kestrel reads (" + std::to_string(kW4Int8LayoutVersion) +
                  "); rebuild the image with this Kestrel's `kestrel build`");
    }
    info.w4_int8_layout = static_cast<uint32_t>(layout);
    const uint64_t q8_layout = file.find_uint(keys::kQ8Int8Layout).value_or(0);
    if (q8_layout > kQ8Int8LayoutVersion) {
      throw Error("image: Q8_0 int8 layout version " + std::to_string(q8_layout) + " (" + keys::kQ8Int8Layout +
                  ") is not the version this Kestrel reads (" + std::to_string(kQ8Int8LayoutVersion) + ")");
    }
    info.q8_int8_layout = static_cast<uint32_t>(q8_layout);
  }
  return info;
}

void verify_content(const gguf::File& file) {
  const uint64_t stored = file.get_uint(keys::kContentHash);
  const uint64_t actual = gguf::content_hash(file, keys::kContentHash);
  if (stored != actual) {
    char msg[160];
    std::snprintf(msg, sizeof(msg),
                  "image content checksum mismatch (stored %016" PRIx64 ", computed %016" PRIx64
                  "): the file is corrupt",
                  stored, actual);
    throw Error(msg);
  }
}

}  // namespace kestrel::image
