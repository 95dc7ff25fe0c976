#include "kestrel/image/builder.h"

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <optional>
#include <ctime>
#include <fstream>
#include <sstream>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/formats/gguf_writer.h"
#include "kestrel/head/flashhead_bound.h"
#include "kestrel/head/flashhead_format.h"
#include "kestrel/image/channel_scaling.h"
#include "kestrel/image/image.h"
#include "kestrel/image/image_writer.h"
#include "kestrel/image/int4_tensors.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/quant/gguf_convert.h"
#include "kestrel/quant/gptq.h"
#include "kestrel/quant/w4.h"
#include "kestrel/text/tokenizer.h"

namespace kestrel::image {
namespace {

using gguf::TensorType;

// Refuses, before any work, an output the final rename could not produce.
void check_output_path(const std::filesystem::path& out) {
  if (out.empty()) throw Error("kestrel build: the output path is empty");
  std::error_code ec;
  if (std::filesystem::is_directory(out, ec)) {
    throw Error("kestrel build: the output " + out.string() + " is a directory");
  }
  const auto parent = out.has_parent_path() ? out.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::is_directory(parent, ec)) {
    throw Error("kestrel build: the output folder " + parent.string() + " does not exist");
  }
}

// An INT4 matrix's group parameters in tensor order (.scales, .mins, .row_scales): fp16 scales
// and mins, or their 8-bit form (one pair of vectors is empty).
void write_group_params(gguf::Writer& w, const std::vector<uint16_t>& scales, const std::vector<uint16_t>& mins,
                        const std::vector<uint8_t>& scales8, const std::vector<uint8_t>& mins8,
                        const std::vector<uint16_t>& row_scales) {
  w.write(as_bytes(scales.data(), scales.size() * sizeof(uint16_t)));
  w.write(as_bytes(mins.data(), mins.size() * sizeof(uint16_t)));
  w.write(as_bytes(scales8.data(), scales8.size()));
  w.write(as_bytes(mins8.data(), mins8.size()));
  w.write(as_bytes(row_scales.data(), row_scales.size() * sizeof(uint16_t)));
}

// ggml Q8_0 (quant::quantize_q8_0). n a multiple of 32.
std::vector<std::byte> quantize_q8_0(const float* x, size_t n) {
  std::vector<std::byte> out(n / 32 * 34);
  quant::quantize_q8_0(x, n, out.data());
  return out;
}

// Writes a layer matrix kept above 4 bits (a --tensor-type override) as `type` (Q8_0 or
// BF16). A matrix AWQ's scales touch (a group member's columns, a fold target's rows) is
// scaled in float32 first, so the stored weights are exactly what the fold assumes, then
// converted; a Q8_0 source that nothing scales is copied as it is; otherwise rows are
// converted a block at a time.
void write_layer_matrix(gguf::Writer& w, const gguf::TensorInfo& t, std::span<const std::byte> bytes,
                        TensorType type, const ChannelScaling& scaling) {
  const size_t cols = static_cast<size_t>(t.shape[0]), rows = static_cast<size_t>(t.shape[1]);
  const bool scaled = scaling.column_scale.count(t.name) != 0 || scaling.row_divisor.count(t.name) != 0;
  auto emit = [&](const float* x, size_t n) {
    if (type == TensorType::kQ8_0) {
      w.write(quantize_q8_0(x, n));
    } else {
      std::vector<uint16_t> b16(n);
      for (size_t i = 0; i < n; ++i) b16[i] = gguf::fp32_to_bf16(x[i]);
      w.write(as_bytes(b16.data(), n * sizeof(uint16_t)));
    }
  };
  if (scaled) {
    std::vector<float> dense(static_cast<size_t>(t.n_elements));
    gguf::dequantize(t.type, bytes.data(), dense.data(), dense.size());
    scaling.apply(t.name, dense.data(), rows, cols);
    emit(dense.data(), dense.size());
    return;
  }
  if (type == t.type) {
    w.write(bytes);
    return;
  }
  const uint64_t src_row_bytes = gguf::row_bytes(t.type, cols);
  const size_t rows_per_step = std::max<size_t>(1, (size_t{1} << 20) / cols);
  std::vector<float> f32(rows_per_step * cols);
  for (size_t r = 0; r < rows; r += rows_per_step) {
    const size_t n = std::min(rows_per_step, rows - r) * cols;
    gguf::dequantize(t.type, bytes.data() + r * src_row_bytes, f32.data(), n);
    emit(f32.data(), n);
  }
}

// Default probes: 1/16 of the clusters (1,024 of 16,384 for Gemma's vocabulary in clusters of
// 16), chosen on development text: 99.64 % same top-1 as the dense head at 5.3x less head time
// (docs/flashhead.md).
size_t default_probes(size_t n_clusters) { return std::max<size_t>(1, n_clusters / 16); }

// What a FlashHead build adds: the clustering, the head's rows in cluster order (source
// bytes), the quantized centroids and the always-scored tokens.
struct FlashHeadData {
  head::Clustering clustering;
  std::vector<std::byte> head_bytes;  // the head tensor, rows permuted
  std::vector<std::byte> centroids;   // Q8_0 [n_clusters, d]
  std::vector<int32_t> special;
  size_t probes = 0;
  head::ClusterBounds bounds;  // the greedy proof's data; empty when the head is not Q8_0
};

FlashHeadData prepare_flashhead(const gguf::File& src, const gguf::TensorInfo& head_tensor,
                                const BuildOptions& options, ThreadPool& pool) {
  FlashHeadData f;
  const size_t d = static_cast<size_t>(head_tensor.shape[0]), v = static_cast<size_t>(head_tensor.shape[1]);
  if (d % 32 != 0) throw Error("FlashHead needs a d_model that is a multiple of 32");
  // Everything that can be refused is refused before the clustering runs.
  const size_t cap = options.flashhead_clustering.cluster_size;
  if (cap == 0 || v % cap != 0) {
    throw Error("FlashHead: the cluster size " + std::to_string(cap) + " must divide the vocabulary (" +
                std::to_string(v) + " tokens)");
  }
  const size_t k = v / cap;
  f.probes = options.flashhead_probes ? options.flashhead_probes : default_probes(k);
  if (f.probes > k) throw Error("--probes " + std::to_string(f.probes) + " exceeds the " + std::to_string(k) + " clusters");
  if (!std::isfinite(options.flashhead_radius_weight) || options.flashhead_radius_weight < 0.0f) {
    throw Error("FlashHead: the radius weight must be a finite number >= 0");
  }
  const auto bytes = src.tensor_data(head_tensor);
  {
    std::vector<float> rows(v * d);
    gguf::dequantize(head_tensor.type, bytes.data(), rows.data(), rows.size());
    f.clustering = head::cluster_rows(rows.data(), v, d, options.flashhead_clustering, pool);
  }
  const size_t row_bytes = static_cast<size_t>(gguf::row_bytes(head_tensor.type, d));
  f.head_bytes.resize(v * row_bytes);
  for (size_t r = 0; r < v; ++r) {
    std::memcpy(&f.head_bytes[r * row_bytes], bytes.data() + static_cast<size_t>(f.clustering.order[r]) * row_bytes, row_bytes);
  }
  f.centroids = quantize_q8_0(f.clustering.centroids.data(), f.clustering.centroids.size());
  if (head_tensor.type == TensorType::kQ8_0) {  // the head is stored as the source has it (Plan::kCopy)
    kernels::Matrix rows_q, cents_q;
    rows_q.type = cents_q.type = kernels::WeightType::kQ8_0;
    rows_q.data = f.head_bytes.data(), rows_q.rows = v, rows_q.cols = d;
    cents_q.data = f.centroids.data(), cents_q.rows = k, cents_q.cols = d;
    f.bounds = head::compute_cluster_bounds(rows_q, cents_q, cap, pool);
  }
  f.special = text::Tokenizer::from_gguf(src).stop_tokens();
  return f;
}

}  // namespace

namespace {

std::string to_hex(const unsigned char* digest, unsigned int len) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr);
  return to_hex(digest, len);
}

std::string sha256_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path.string());
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  return to_hex(digest, len);
}

void check_not_an_image(const gguf::File& file, const std::filesystem::path& source) {
  if (file.has(keys::kFormatVersion)) {
    throw Error(source.string() + " is already a Kestrel image; build from the original checkpoint");
  }
}

BuildReport build_image(const std::filesystem::path& source, const std::filesystem::path& out,
                        const BuildOptions& options, ThreadPool& pool) {
  const auto t0 = std::chrono::steady_clock::now();
  if (options.precision == quant::Precision::kSource || options.precision == quant::Precision::kAuto) {
    throw Error("kestrel build: choose a precision (w4a16, bf16 or fp16)");
  }
  check_output_path(out);
  if (!options.assistant.empty()) {
    throw Error("kestrel build: --assistant needs the target as a Gemma 4 Hugging Face checkpoint directory (" +
                source.string() + " is not one)");
  }
  const gguf::File src = gguf::File::open(source);
  check_not_an_image(src, source);
  const bool w4 = options.precision == quant::Precision::kW4A16;
  const size_t group = options.group_size;
  if (w4 && (group == 0 || group % 32 != 0)) {
    throw Error("--group-size must be a multiple of 32 (32, 64 or 128)");
  }
  if (w4 && options.scale_bits != 16 && (options.scale_bits != 8 || !options.zero_points || options.gptq)) {
    throw Error("--scale-bits must be 16, or 8 with affine groups and without --gptq (got " +
                std::to_string(options.scale_bits) + ")");
  }
  if (w4 && options.integer_zero_points && (!options.zero_points || options.scale_bits != 16 || options.gptq)) {
    throw Error("integer zero points need affine groups with 16-bit scales, without --symmetric, --scale-bits 8 or --gptq");
  }
  // INT4 matrices already in the source (an imported compressed-tensors checkpoint): copied.
  auto has_suffix = [](const std::string& n, const char* suffix) {
    const size_t k = std::strlen(suffix);
    return n.size() > k && n.compare(n.size() - k, k, suffix) == 0;
  };
  bool prequantized = false;
  for (const auto& t : src.tensors()) {
    if (!has_suffix(t.name, kQ4Suffix)) continue;
    prequantized = true;
    const std::string base = t.name.substr(0, t.name.size() - std::strlen(kQ4Suffix));
    const gguf::TensorInfo* sc = src.find_tensor(base + kScalesSuffix);
    const gguf::TensorInfo* mn = src.find_tensor(base + kMinsSuffix);
    if (!w4 || t.type != TensorType::kI8 || t.shape.size() != 2 || sc == nullptr || sc->type != TensorType::kF16 ||
        sc->shape.size() != 2 || sc->shape[1] != t.shape[1] || sc->shape[0] * group != t.shape[0] * 2 ||
        (mn != nullptr) != options.zero_points || (mn != nullptr && mn->shape != sc->shape) ||
        options.scale_bits != 16) {
      throw Error("the source's INT4 matrix " + base + " does not match the build (w4a16, group size " +
                  std::to_string(group) + (options.zero_points ? ", zero points" : ", symmetric") +
                  ", 16-bit scales): build with the checkpoint's own group size and zero points");
    }
  }
  if (!w4 && !options.tensor_types.empty()) {
    throw Error("--tensor-type applies to --precision w4a16 only (a " +
                std::string(quant::precision_name(options.precision)) + " build stores every layer matrix the same way)");
  }
  check_overrides_match(src, options.tensor_types);
  auto storage = [&](const std::string& name) { return storage_of(name, options.tensor_types); };
  BuildReport report;
  report.source_bytes = src.file_size();
  report.source_sha256 = sha256_file(source);

  // AWQ: every group's scales are chosen before any tensor is written, since a norm the
  // scales fold into may come before its matrices in the source.
  ChannelScaling scaling;
  if (w4 && options.channel_scaling != nullptr) {
    scaling = *options.channel_scaling;
  } else if (w4 && options.calibration && options.awq_scaling) {
    const quant::W4Params params{group, options.zero_points, true, options.integer_zero_points};
    scaling = search_channel_scaling(
        src, *options.calibration, params, options.awq_grid, pool,
        [&](size_t done, size_t total, const std::string& name, const quant::AwqSearchResult& r) {
          if (!options.log) return;
          char line[256];
          std::snprintf(line, sizeof(line), "AWQ %zu/%zu %s: alpha %.2f, output error %.3fx of unscaled", done,
                        total, name.c_str(), static_cast<double>(r.alpha),
                        r.error_unscaled > 0 ? r.error / r.error_unscaled : 1.0);
          options.log(line);
        },
        [&](const std::string& name) { return storage(name) == MatrixStorage::kInt4; });
  }

  std::filesystem::path partial = out;
  partial += ".partial";
  gguf::Writer w(partial, kAlignment);
  add_source_metadata(w, src);
  w.add_uint32(keys::kFormatVersion, kFormatVersion);
  w.add_string(keys::kPrecision, quant::precision_name(options.precision));
  if (w4) {
    w.add_uint32(keys::kGroupSize, static_cast<uint32_t>(group));
    std::string method = !options.calibration ? "rtn"
                         : !scaling.empty()  ? "awq-activation-weighted"
                                             : "rtn-activation-weighted";
    if (options.calibration && options.gptq && options.zero_points) method += "-gptq";
    if (prequantized) {  // the source's integers and scales, copied
      method = options.source_quant_method.empty() ? "compressed-tensors" : options.source_quant_method;
    }
    w.add_string(keys::kQuantMethod, method);
    w.add_uint32(keys::kZeroPoints, options.zero_points ? 1 : 0);
    if (options.zero_points && (options.integer_zero_points || prequantized)) w.add_string(keys::kZeroPointType, "int");
    if (options.scale_bits != 16) w.add_uint32(keys::kScaleBits, static_cast<uint32_t>(options.scale_bits));
    if (!options.tensor_types.empty()) w.add_string(keys::kTensorTypes, overrides_string(options.tensor_types));
  }
  w.add_string(keys::kKestrelVersion, KESTREL_VERSION);
  w.add_string(keys::kBuildDate, utc_now());
  w.add_string(keys::kSourceFile, options.source_name.empty() ? source.filename().string() : options.source_name);
  w.add_string(keys::kSourceSha256, report.source_sha256);
  w.add_string(keys::kCalibrationSha256, options.calibration_sha256);
  w.add(keys::kSeed, gguf::Value{gguf::ValueType::kUint64, options.seed});
  w.add_string(keys::kLicenseText, license_text(source, options.license_files));
  // FlashHead: the head is output.weight, or the tied token embedding.
  const gguf::TensorInfo* head_tensor = src.find_tensor("output.weight");
  if (head_tensor == nullptr) head_tensor = src.find_tensor("token_embd.weight");
  std::optional<FlashHeadData> flash;
  if (options.flashhead) {
    if (head_tensor == nullptr || head_tensor->shape.size() != 2) throw Error("FlashHead: the source has no output head");
    const auto tf = std::chrono::steady_clock::now();
    flash = prepare_flashhead(src, *head_tensor, options, pool);
    report.flashhead_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tf).count();
    report.flashhead_mean_cosine = flash->clustering.mean_cosine;
    w.add_uint32(head::keys::kClusterSize, static_cast<uint32_t>(flash->clustering.cluster_size));
    w.add_uint32(head::keys::kClusters, static_cast<uint32_t>(flash->clustering.n_clusters));
    w.add_uint32(head::keys::kProbes, static_cast<uint32_t>(flash->probes));
    w.add(head::keys::kRadiusWeight, gguf::Value{gguf::ValueType::kFloat32, static_cast<double>(options.flashhead_radius_weight)});
    w.add_uint32(head::keys::kIterations, static_cast<uint32_t>(options.flashhead_clustering.iterations));
    w.add(head::keys::kSeed, gguf::Value{gguf::ValueType::kUint64, options.flashhead_clustering.seed});
    if (!flash->bounds.radius.empty()) w.add_uint32(head::keys::kBoundVersion, head::keys::kCurrentBoundVersion);
  }
  w.add_placeholder_u64(keys::kContentHash);

  // Plan: what each source tensor becomes.
  // kHalf: bf16 or fp16 as asked (bf16 for a w4a16 override); kQ8_0: a w4a16 override.
  enum class Plan { kInt4, kHalf, kQ8_0, kCopy, kF32 };
  const TensorType half = options.precision == quant::Precision::kFP16 ? TensorType::kF16 : TensorType::kBF16;
  std::vector<Plan> plans;
  // Per tensor: an INT4 layer matrix stored in the int8 layout (the rest stay plain).
  std::vector<char> int8_layouts;
  for (const auto& t : src.tensors()) {
    const bool int4_part =
        has_suffix(t.name, kQ4Suffix) || has_suffix(t.name, kScalesSuffix) || has_suffix(t.name, kMinsSuffix);
    if (!int4_part && !gguf::is_supported(t.type)) {
      throw Error("tensor '" + t.name + "' has type " + gguf::tensor_type_name(t.type) +
                  ", which kestrel build cannot read");
    }
    Plan p;
    if (int4_part) {
      p = Plan::kCopy;  // an INT4 matrix of the source, checked above
    } else if (is_layer_matrix(t)) {
      const MatrixStorage st = w4 ? storage(t.name) : MatrixStorage::kBF16;
      p = !w4 ? Plan::kHalf
          : st == MatrixStorage::kInt4 ? Plan::kInt4
          : st == MatrixStorage::kQ8_0 ? Plan::kQ8_0
                                       : Plan::kHalf;
      if (p == Plan::kQ8_0 && t.shape[0] % 32 != 0) {
        throw Error("tensor '" + t.name + "' has rows of " + std::to_string(t.shape[0]) +
                    ", not a multiple of 32: it cannot be stored as q8_0");
      }
      if (p == Plan::kInt4 && t.shape[0] % group != 0) {
        throw Error("tensor '" + t.name + "' has rows of " + std::to_string(t.shape[0]) +
                    ", not a multiple of the group size " + std::to_string(group));
      }
    } else if (t.shape.size() == 2) {  // the embedding / output head
      using Embedding = BuildOptions::Embedding;
      p = !w4                                          ? Plan::kHalf
          : options.embedding == Embedding::kInt4      ? Plan::kInt4
          : options.embedding == Embedding::kQ8_0      ? Plan::kQ8_0
                                                       : Plan::kCopy;
      if (p == Plan::kInt4 && t.shape[0] % group != 0) p = Plan::kCopy;
      if (p == Plan::kQ8_0 && (t.shape[0] % 32 != 0 || t.type == TensorType::kQ8_0)) p = Plan::kCopy;
    } else {
      p = Plan::kF32;
    }
    plans.push_back(p);
    // Layer matrices the int8 kernels can run are stored as they read them (no copy at load);
    // the embedding and the head keep their rows (read by row, and as stored: gemv_w4_rows.h).
    const bool int8_layout = options.int8_layout && p == Plan::kInt4 && is_layer_matrix(t) &&
                             kernels::w4_int8_shape_supported(t.shape[1], t.shape[0], group);
    int8_layouts.push_back(int8_layout);
    if (int8_layout) {
      for (const Int8LayoutTensor& l : int8_layout_tensors(t.shape[1], t.shape[0], group, options.scale_bits,
                                                           options.zero_points)) {
        w.add_tensor(t.name + l.suffix, l.type, l.shape);
      }
      continue;
    }
    switch (p) {
      case Plan::kInt4:
        w.add_tensor(t.name + kQ4Suffix, TensorType::kI8, {t.shape[0] / 2, t.shape[1]});
        if (options.scale_bits == 8) {
          w.add_tensor(t.name + kScalesSuffix, TensorType::kI8, {t.shape[0] / group, t.shape[1]});
          w.add_tensor(t.name + kMinsSuffix, TensorType::kI8, {t.shape[0] / group, t.shape[1]});
          w.add_tensor(t.name + kRowScalesSuffix, TensorType::kF16, {2, t.shape[1]});
          break;
        }
        w.add_tensor(t.name + kScalesSuffix, TensorType::kF16, {t.shape[0] / group, t.shape[1]});
        if (options.zero_points) {
          w.add_tensor(t.name + kMinsSuffix, TensorType::kF16, {t.shape[0] / group, t.shape[1]});
        }
        break;
      case Plan::kHalf: w.add_tensor(t.name, half, t.shape); break;
      case Plan::kQ8_0: w.add_tensor(t.name, TensorType::kQ8_0, t.shape); break;
      case Plan::kCopy: w.add_tensor(t.name, t.type, t.shape); break;
      case Plan::kF32: w.add_tensor(t.name, TensorType::kF32, t.shape); break;
    }
    if (w4 && t.name == "token_embd.weight") {
      w.add_string(keys::kEmbeddingType, p == Plan::kInt4   ? "INT4"
                                         : p == Plan::kQ8_0 ? "Q8_0"
                                                            : gguf::tensor_type_name(t.type));
    }
  }
  if (std::find(int8_layouts.begin(), int8_layouts.end(), 1) != int8_layouts.end()) {
    w.add_uint32(keys::kW4Int8Layout, kW4Int8LayoutVersion);
  }
  if (flash) {
    const uint64_t d = head_tensor->shape[0], v = head_tensor->shape[1];
    w.add_tensor(head::kRowTokensTensor, TensorType::kI32, {v});
    w.add_tensor(head::kCentroidsTensor, TensorType::kQ8_0, {d, flash->clustering.n_clusters});
    w.add_tensor(head::kRadiiTensor, TensorType::kF32, {flash->clustering.n_clusters});
    w.add_tensor(head::kSpecialTokensTensor, TensorType::kI32, {flash->special.size()});
    if (!flash->bounds.radius.empty()) {
      w.add_tensor(head::kBoundRadiiTensor, TensorType::kF32, {flash->clustering.n_clusters});
      w.add_tensor(head::kBoundNormsTensor, TensorType::kF32, {flash->clustering.n_clusters});
    }
  }
  w.begin_data();
  const auto& tensors = src.tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    const std::span<const std::byte> data =
        flash && &t == head_tensor ? std::span<const std::byte>(flash->head_bytes) : src.tensor_data(t);
    switch (plans[i]) {
      case Plan::kInt4: {
        const quant::ActivationStats* stats = nullptr;
        if (options.calibration) {
          const auto it = options.calibration->find(t.name);
          if (it != options.calibration->end() && it->second->cols == t.shape[0]) stats = it->second.get();
        }
        const float* importance = nullptr;
        std::vector<float> scaled_importance;
        if (stats != nullptr && stats->mean_square.size() == t.shape[0]) {
          importance = stats->mean_square.data();
          // The image's matrix W diag(s) reads x / s: E[(x_i / s_i)^2] = E[x_i^2] / s_i^2.
          if (const auto s = scaling.column_scale.find(t.name); s != scaling.column_scale.end()) {
            scaled_importance = stats->mean_square;
            for (size_t c = 0; c < scaled_importance.size(); ++c) scaled_importance[c] /= s->second[c] * s->second[c];
            importance = scaled_importance.data();
          }
        }
        const bool gptq = options.gptq && options.zero_points && stats != nullptr && stats->n_sample() > 0;
        const bool scaled = scaling.column_scale.count(t.name) != 0 || scaling.row_divisor.count(t.name) != 0;
        if (!gptq && !scaled) {
          // A block of rows at a time: the per-layer token table alone is 2.8 G values. A matrix
          // in the int8 layout (a layer's: small next to the source) is gathered whole first.
          const size_t cols = static_cast<size_t>(t.shape[0]), rows = static_cast<size_t>(t.shape[1]);
          const size_t block_rows = std::max<size_t>(1, options.int4_block_values / cols);
          quant::W4Matrix whole;
          const auto groups = quant::quantize_w4_rows(
              t.type, data, rows, cols, group, importance, options.zero_points, block_rows,
              [&](std::span<const uint8_t> codes) {
                if (int8_layouts[i]) {
                  whole.qs.insert(whole.qs.end(), codes.begin(), codes.end());
                } else {
                  w.write(as_bytes(codes.data(), codes.size()));
                }
              },
              pool, options.scale_bits, options.integer_zero_points);
          if (!int8_layouts[i]) {
            write_group_params(w, groups.scales, groups.mins, groups.scales8, groups.mins8, groups.row_scales);
            break;
          }
          whole.rows = rows;
          whole.cols = cols;
          whole.group_size = group;
          whole.scales = groups.scales;
          whole.mins = groups.mins;
          whole.scales8 = groups.scales8;
          whole.mins8 = groups.mins8;
          whole.row_scales = groups.row_scales;
          write_int8_layout(w, whole, pool);
          break;
        }
        // AWQ's scales or GPTQ need the whole matrix (a layer matrix: small next to the source).
        std::vector<float> dense(t.n_elements);
        gguf::dequantize(t.type, data.data(), dense.data(), dense.size());
        scaling.apply(t.name, dense.data(), t.shape[1], t.shape[0]);
        quant::W4Matrix q;
        if (gptq) {
          // GPTQ sees the image's inputs: x / s where AWQ scaled the columns.
          std::vector<float> x = stats->sample;
          if (const auto s = scaling.column_scale.find(t.name); s != scaling.column_scale.end()) {
            for (size_t k = 0; k < x.size(); ++k) x[k] /= s->second[k % stats->cols];
          }
          q = quant::quantize_w4_gptq(dense.data(), t.shape[1], t.shape[0], group, x.data(), stats->n_sample(), 0.01, pool);
        } else {
          q = quant::quantize_w4(dense.data(), t.shape[1], t.shape[0], group, importance, options.zero_points, pool,
                                 false, options.integer_zero_points);
          if (options.scale_bits == 8) quant::compress_group_params(q, dense.data(), importance, pool);
        }
        if (int8_layouts[i]) {
          write_int8_layout(w, q, pool);
          break;
        }
        w.write(as_bytes(q.qs.data(), q.qs.size()));
        write_group_params(w, q.scales, q.mins, q.scales8, q.mins8, q.row_scales);
        break;
      }
      case Plan::kHalf:
        if (w4) {
          write_layer_matrix(w, t, data, half, scaling);
        } else {
          write_converted(w, t, data, half);
        }
        break;
      case Plan::kQ8_0: write_layer_matrix(w, t, data, TensorType::kQ8_0, scaling); break;
      case Plan::kCopy: w.write(data); break;
      case Plan::kF32:
        if (scaling.vector_divisor.count(t.name) != 0) {  // a norm AWQ's scales fold into
          std::vector<float> v(t.n_elements);
          gguf::dequantize(t.type, data.data(), v.data(), v.size());
          scaling.apply(t.name, v.data(), 1, v.size());
          w.write(as_bytes(v.data(), v.size() * sizeof(float)));
        } else {
          write_converted(w, t, data, TensorType::kF32);
        }
        break;
    }
    src.release(t);  // its pages are done with: the build's RSS stays near one block, not the source
    if (options.progress) options.progress(i + 1, tensors.size(), t.name);
  }
  if (flash) {
    w.write(as_bytes(flash->clustering.order.data(), flash->clustering.order.size() * sizeof(int32_t)));
    w.write(flash->centroids);
    w.write(as_bytes(flash->clustering.radii.data(), flash->clustering.radii.size() * sizeof(float)));
    w.write(as_bytes(flash->special.data(), flash->special.size() * sizeof(int32_t)));
    if (!flash->bounds.radius.empty()) {
      w.write(as_bytes(flash->bounds.radius.data(), flash->bounds.radius.size() * sizeof(float)));
      w.write(as_bytes(flash->bounds.norm.data(), flash->bounds.norm.size() * sizeof(float)));
    }
    flash.reset();
  }
  w.patch(keys::kContentHash, w.content_hash(keys::kContentHash));
  w.finish();
  std::filesystem::rename(partial, out);
  report.n_tensors = tensors.size();
  report.image_bytes = std::filesystem::file_size(out);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace kestrel::image
