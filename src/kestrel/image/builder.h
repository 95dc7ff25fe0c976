// `kestrel build`: turns a source checkpoint into a Kestrel image.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/head/clustering.h"
#include "kestrel/image/channel_scaling.h"
#include "kestrel/image/tensor_types.h"
#include "kestrel/quant/awq.h"
#include "kestrel/quant/precision.h"

namespace kestrel::image {

struct BuildOptions {
  quant::Precision precision = quant::Precision::kW4A16;
  size_t group_size = 32;  // w4a16: weights per fp16 scale (32, 64 or 128)
  uint64_t seed = 0;       // recorded; the RTN path is deterministic without it
  /// w4a16: how the 2-D tensors outside the layers are stored (token embedding / output head,
  /// Gemma 4's per-layer token table and model projection): as in the source, INT4 (group_size,
  /// zero_points and scale_bits as the layers), or Q8_0 (rows must be multiples of 32).
  enum class Embedding { kSource, kInt4, kQ8_0 };
  Embedding embedding = Embedding::kSource;
  /// w4a16: INT4 tensors are dequantized and quantized this many float32 values (whole rows,
  /// at least one) at a time, so the build holds ~4 bytes x this, not a whole tensor, in RAM.
  size_t int4_block_values = size_t{1} << 24;
  /// w4a16: affine groups (an fp16 scale and minimum each) instead of symmetric ones.
  bool zero_points = true;
  /// w4a16 with zero_points: each group's minimum tied to an integer zero point z in 0..15
  /// (m = quant::integer_zero_point_min(d, z)), the form compressed-tensors checkpoints store,
  /// so that `kestrel export` writes the image without requantizing. Not with scale_bits 8 or
  /// gptq. Recorded as kestrel.quant.zero_point_type "int" (absent: "float").
  bool integer_zero_points = false;
  /// w4a16: bits of each group's scale and minimum: 16 (fp16) or 8 (u8 under an fp16 pair per
  /// row, quant::compress_group_params; affine groups only, not with gptq).
  int scale_bits = 16;
  /// w4a16: store each INT4 layer matrix the int8 kernels can run in their layout (image.h's
  /// kInt8*Suffix tensors: loads on the default int8 path copy nothing); false: every INT4
  /// matrix plain (".q4", ".scales", ...), as images were before 2026-12-07 (`--int4-layout
  /// plain`; each load then makes the int8 copy).
  bool int8_layout = true;
  /// Activation-aware quantization (runtime/calibration.h): per layer matrix (GGUF name), the
  /// statistics of its input. Each group's scale (and minimum) then minimizes the error
  /// weighted by the mean squared input per channel, and, with awq_scaling, AWQ's per-channel
  /// scales (image/channel_scaling.h) are searched on the recorded input rows and folded into
  /// the preceding norms / ffn_up rows. Null: plain round-to-nearest.
  const quant::ActivationStatsMap* calibration = nullptr;
  bool awq_scaling = true;
  size_t awq_grid = 20;  // alpha values tried, 0 to 1
  /// w4a16: per-tensor storage overrides (image/tensor_types.h has the matching rule): a
  /// layer matrix matched by one is stored as Q8_0 or BF16 (or INT4) instead of INT4. AWQ's
  /// search then scores only a group's INT4 matrices (a group with none is not scaled); the
  /// group's scales are still applied to its Q8_0/BF16 members and fold targets before they
  /// are converted, so the fold stays exact. Every pattern must match a layer matrix.
  std::vector<TensorTypeOverride> tensor_types;
  /// Per-channel scales to fold instead of AWQ's search (tests; a search's result reused).
  /// Null: search when calibration and awq_scaling say so.
  const ChannelScaling* channel_scaling = nullptr;
  /// GPTQ's error compensation (quant/gptq.h) on the recorded input rows, after AWQ's scaling.
  bool gptq = false;
  /// Messages about the build's choices (AWQ's alpha per group); optional.
  std::function<void(const std::string&)> log;
  std::string calibration_sha256;  // of the calibration text, recorded in the image
  /// The format of a source whose INT4 matrices are copied (kestrel.quant.method): set by
  /// build_image_from_hf for AWQ / GPTQ checkpoints; empty: "compressed-tensors".
  std::string source_quant_method;
  /// The source's name as the image records it (kestrel.source.file); empty: the source file's
  /// name. A Hugging Face directory built through an intermediate GGUF names the directory.
  std::string source_name;
  /// Licence / NOTICE files to carry. Files named LICENSE*, NOTICE*, COPYING* or *TERMS* next to
  /// the source are added as well.
  std::vector<std::filesystem::path> license_files;
  /// FlashHead (docs/flashhead.md): cluster the output head's rows, store them in cluster
  /// order with the stage-1 centroids. `flashhead.seed` seeds the clustering.
  bool flashhead = false;
  head::ClusteringOptions flashhead_clustering;
  float flashhead_radius_weight = 0.1f;  // alpha of the stage-1 score (docs/flashhead.md)
  size_t flashhead_probes = 0;  // default probes recorded in the image; 0: 1/16 of the clusters
  /// build_image_from_hf of a Gemma 4 checkpoint: a Gemma 4 MTP assistant checkpoint
  /// (image/hf_gemma4_assistant.h) to store in the image with the target (mtp.* tensors, kept
  /// as the embedding is kept; gemma4_assistant.* metadata). Empty: none. build_image refuses it.
  std::filesystem::path assistant;
  /// Called after each tensor: (tensors done, tensors in all, the tensor's name).
  std::function<void(size_t, size_t, const std::string&)> progress;
};

struct BuildReport {
  uint64_t source_bytes = 0;
  uint64_t image_bytes = 0;
  size_t n_tensors = 0;
  double seconds = 0;
  std::string source_sha256;
  double flashhead_seconds = 0;       // clustering wall time
  double flashhead_mean_cosine = 0;   // quality of the clustering
};

/// Builds the image `out` from the GGUF `source`, one tensor in memory at a time. Layer
/// matrices (2-D tensors under "blk.") become INT4 (w4a16, unless options.tensor_types say
/// Q8_0 or BF16) or BF16; the token embedding, which
/// is also the tied output head, keeps the source's type in w4a16 images (Q8_0 for the default
/// model) and becomes BF16 in bf16 images; vectors become F32. The file is written to
/// `out`.partial and renamed when complete.
/// A source that already holds INT4 matrices (NAME.q4 with NAME.scales, and NAME.mins or not,
/// as an image stores them: what the compressed-tensors import writes, image/hf_gemma3.h) has
/// them copied byte for byte; options.group_size and zero_points must then match them.
/// Throws kestrel::Error (gguf::GgufError for a bad source) and leaves no partial file; also
/// when tensor_types is set for a bf16/fp16 build, a pattern matches no layer matrix, or a
/// Q8_0 matrix's rows are not a multiple of 32.
BuildReport build_image(const std::filesystem::path& source, const std::filesystem::path& out,
                        const BuildOptions& options, ThreadPool& pool);

/// Throws kestrel::Error when `source` (opened as `file`) is already a Kestrel image: images are
/// built from the original checkpoint, never from another image.
void check_not_an_image(const gguf::File& file, const std::filesystem::path& source);

/// SHA-256 of a file / of bytes, as lowercase hex.
std::string sha256_file(const std::filesystem::path& path);
std::string sha256_hex(std::string_view bytes);

}  // namespace kestrel::image
