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
/// w4a16 with zero points: "int" when every minimum stands for an integer zero point
/// (quant::integer_zero_point_min; built with --zero-points int, or imported from a
/// compressed-tensors checkpoint); absent: "float" (a free fp16 minimum).
inline constexpr const char* kZeroPointType = "kestrel.quant.zero_point_type";
/// w4a16: bits of a group's scale and minimum, 16 (fp16, the default when absent) or 8 (u8
/// under an fp16 pair per row, quant::compress_group_params).
inline constexpr const char* kScaleBits = "kestrel.quant.scale_bits";
inline constexpr const char* kEmbeddingType = "kestrel.quant.embedding_type";
/// w4a16 with --tensor-type overrides: "PATTERN=TYPE,..." as given (image/tensor_types.h);
/// matched layer matrices are stored under their plain name as Q8_0 or BF16.
inline constexpr const char* kTensorTypes = "kestrel.quant.tensor_types";
/// w4a16: the version of the int8 layout (kW4Int8LayoutVersion) that the layer matrices stored
/// under kInt8CodesSuffix and its siblings hold; absent: every INT4 matrix is plain (".q4").
inline constexpr const char* kW4Int8Layout = "kestrel.layout.w4_int8";
/// The version of the Q8_0 int8 layout (kQ8Int8LayoutVersion) that the layer matrices stored
/// under kQ8Int8CodesSuffix hold; absent: Q8_0 layer matrices are plain ggml rows.
inline constexpr const char* kQ8Int8Layout = "kestrel.layout.q8_0_int8";
inline constexpr const char* kContentHash = "kestrel.content_xxh3";
inline constexpr const char* kKestrelVersion = "kestrel.build.kestrel_version";
inline constexpr const char* kBuildDate = "kestrel.build.date";
inline constexpr const char* kSourceFile = "kestrel.build.source_file";
inline constexpr const char* kSourceSha256 = "kestrel.build.source_sha256";
inline constexpr const char* kCalibrationSha256 = "kestrel.build.calibration_sha256";
inline constexpr const char* kSeed = "kestrel.build.seed";
/// An auto image (image/auto_image.h, the GGUF image cache): the converter version that wrote it.
inline constexpr const char* kAutoVersion = "kestrel.build.gguf_auto_version";
inline constexpr const char* kLicenseText = "kestrel.license.text";
}  // namespace keys

/// Tensor-name suffixes of an INT4 matrix: packed nibbles (I8, {cols/2, rows}) and fp16
/// scales (F16, {cols/group_size, rows}), beside the source name, e.g. "blk.0.attn_q.weight.q4".
inline constexpr const char* kQ4Suffix = ".q4";
inline constexpr const char* kScalesSuffix = ".scales";
/// With zero points: fp16 group minimums (F16, {cols/group_size, rows}).
inline constexpr const char* kMinsSuffix = ".mins";
/// With 8-bit group parameters (kScaleBits 8) ".scales" and ".mins" are I8 {cols/group_size,
/// rows} holding u8 s_g and n_g, and this F16 {2, rows} tensor holds each row's d_row, m_row.
inline constexpr const char* kRowScalesSuffix = ".row_scales";

/// The int8 layout (keys::kW4Int8Layout; kernels/gemv_w4_int8.h, W4Int8Interleaved): an INT4
/// layer matrix as the int8-activation kernels read it, in place of the tensors above. Rows in
/// blocks of 16, 8 columns an octet: codes I8 {64, cols/8, rows/16}.
inline constexpr const char* kInt8CodesSuffix = ".q4i8";
/// Group parameters per block of 16 rows and group, the 16 rows innermost: {16, cols/group_size,
/// rows/16}, F16 d (16-bit parameters) or I8 u8 s_g (8-bit).
inline constexpr const char* kInt8ScalesSuffix = ".q4i8_scales";
/// The same shape: F16 m (16-bit parameters, symmetric groups too: m = -8 d) or I8 u8 n_g (8-bit
/// parameters with zero points).
inline constexpr const char* kInt8MinsSuffix = ".q4i8_mins";
/// 8-bit parameters: F32 {rows, 2}, every row's d_row, then every row's m_row.
inline constexpr const char* kInt8RowScalesSuffix = ".q4i8_rows";
/// The int8 layout this Kestrel writes and reads (keys::kW4Int8Layout).
constexpr uint32_t kW4Int8LayoutVersion = 1;

/// The Q8_0 int8 layout (keys::kQ8Int8Layout; kernels/gemv_q8_interleaved.h, Q8Interleaved): a
/// Q8_0 layer matrix as the int8-activation kernel reads it, in place of the plain NAME tensor.
/// Codes + 128, rows in blocks of 16 (padded with code 0), 4 columns a quad: U8 stored as I8
/// {64, cols/4, padded_rows/16}.
inline constexpr const char* kQ8Int8CodesSuffix = ".q8i";
/// The block scales widened to float32, per block of 16 rows and block of 32 columns, the 16 rows
/// innermost: F32 {16, cols/32, padded_rows/16}.
inline constexpr const char* kQ8Int8ScalesSuffix = ".q8i_scales";
/// The Q8_0 int8 layout this Kestrel writes and reads (keys::kQ8Int8Layout).
constexpr uint32_t kQ8Int8LayoutVersion = 1;

struct ImageInfo {
  uint32_t format_version = 0;
  quant::Precision precision = quant::Precision::kSource;
  size_t group_size = 0;
  bool zero_points = false;  // w4a16: affine groups (".mins" tensors present)
  int scale_bits = 16;       // w4a16: 16 or 8 (kScaleBits)
  uint32_t w4_int8_layout = 0;  // w4a16: keys::kW4Int8Layout (0: absent, every INT4 matrix plain)
  uint32_t q8_int8_layout = 0;  // w4a16: keys::kQ8Int8Layout (0: absent, Q8_0 matrices plain)
};

/// nullopt for a plain GGUF (no kestrel.format_version). Throws kestrel::Error for an image of
/// another format version or with inconsistent Kestrel keys.
std::optional<ImageInfo> read_image_info(const gguf::File& file);

/// Recomputes the content hash and compares it with kestrel.content_xxh3. Throws kestrel::Error
/// naming both values when they differ (a corrupt image).
void verify_content(const gguf::File& file);

}  // namespace kestrel::image
