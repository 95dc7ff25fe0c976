// Kestrel model images: one GGUF v3 file with Kestrel's keys and tensors (docs/image-format.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kestrel/formats/gguf.h"
#include "kestrel/quant/precision.h"

namespace kestrel::image {

/// The image layout this Kestrel writes and reads. Bumped on any incompatible change.
constexpr uint32_t kFormatVersion = 1;
/// Alignment of every tensor in an image (bytes).
constexpr uint64_t kAlignment = 64;

namespace keys {
inline constexpr const char* kFormatVersion = "kestrel.format_version";
inline constexpr const char* kPrecision = "kestrel.precision";
inline constexpr const char* kGroupSize = "kestrel.quant.group_size";
inline constexpr const char* kQuantMethod = "kestrel.quant.method";
inline constexpr const char* kZeroPoints = "kestrel.quant.zero_points";
inline constexpr const char* kEmbeddingType = "kestrel.quant.embedding_type";
/// w4a16 with --tensor-type overrides: "PATTERN=TYPE,..." as given (image/tensor_types.h);
/// matched layer matrices are stored under their plain name as Q8_0 or BF16.
inline constexpr const char* kTensorTypes = "kestrel.quant.tensor_types";
inline constexpr const char* kContentHash = "kestrel.content_xxh3";
inline constexpr const char* kKestrelVersion = "kestrel.build.kestrel_version";
inline constexpr const char* kBuildDate = "kestrel.build.date";
inline constexpr const char* kSourceFile = "kestrel.build.source_file";
inline constexpr const char* kSourceSha256 = "kestrel.build.source_sha256";
inline constexpr const char* kCalibrationSha256 = "kestrel.build.calibration_sha256";
inline constexpr const char* kSeed = "kestrel.build.seed";
inline constexpr const char* kLicenseText = "kestrel.license.text";
}  // namespace keys

/// Tensor-name suffixes of an INT4 matrix: packed nibbles (I8, {cols/2, rows}) and fp16
/// scales (F16, {cols/group_size, rows}), beside the source name, e.g. "blk.0.attn_q.weight.q4".
inline constexpr const char* kQ4Suffix = ".q4";
inline constexpr const char* kScalesSuffix = ".scales";
/// With zero points: fp16 group minimums (F16, {cols/group_size, rows}).
inline constexpr const char* kMinsSuffix = ".mins";

struct ImageInfo {
  uint32_t format_version = 0;
  quant::Precision precision = quant::Precision::kSource;
  size_t group_size = 0;
  bool zero_points = false;  // w4a16: affine groups (".mins" tensors present)
};

/// nullopt for a plain GGUF (no kestrel.format_version). Throws kestrel::Error for an image of
/// another format version or with inconsistent Kestrel keys.
std::optional<ImageInfo> read_image_info(const gguf::File& file);

/// Recomputes the content hash and compares it with kestrel.content_xxh3. Throws kestrel::Error
/// naming both values when they differ (a corrupt image).
void verify_content(const gguf::File& file);

}  // namespace kestrel::image
