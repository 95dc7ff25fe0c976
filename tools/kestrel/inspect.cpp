// kestrel inspect: what a model file holds.
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/head/flashhead_format.h"
#include "kestrel/image/hf_gemma4_assistant.h"
#include "kestrel/image/image.h"
#include "kestrel/image/int4_tensors.h"
#include "kestrel/runtime/model_path.h"

namespace kestrel::tools {
namespace {

std::string text_or(const gguf::File& f, const char* key, const char* fallback = "-") {
  if (const auto* v = f.find(key); v != nullptr && v->type == gguf::ValueType::kString) {
    return std::get<std::string>(v->data);
  }
  if (const auto v = f.find_uint(key)) return std::to_string(*v);
  return fallback;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// W4A16 images: how the layer matrices ("blk.*") are stored, INT4 counting its packed codes,
// scales and minimums in either layout (image/int4_tensors.h), and the --tensor-type overrides
// that kept some at Q8_0 / BF16.
void print_layer_storage(const gguf::File& f) {
  std::map<std::string, std::pair<size_t, uint64_t>> by_storage;
  size_t int8_layout = 0;
  for (const auto& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    if (const std::string base = image::int4_base(t.name); !base.empty() && ends_with(base, ".weight")) {
      ++by_storage["INT4"].first;
      by_storage["INT4"].second += t.n_bytes;
      if (ends_with(t.name, image::kInt8CodesSuffix)) ++int8_layout;
    } else if (image::is_int4_params_tensor(t.name)) {
      by_storage["INT4"].second += t.n_bytes;
    } else if (ends_with(t.name, image::kQ8Int8CodesSuffix) || ends_with(t.name, image::kQ8Int8ScalesSuffix)) {
      // Q8_0 in the int8 kernel's layout (image/q8_tensors.h: the GGUF image cache's images)
      auto& [count, bytes] = by_storage["Q8_0-int8-layout"];
      count += ends_with(t.name, image::kQ8Int8CodesSuffix) ? 1 : 0;
      bytes += t.n_bytes;
    } else if (t.shape.size() == 2 && ends_with(t.name, ".weight")) {
      auto& [count, bytes] = by_storage[gguf::tensor_type_name(t.type)];
      ++count;
      bytes += t.n_bytes;
    }
  }
  std::printf("layers       ");
  for (const auto& [type, cb] : by_storage) {
    std::printf(" %s x%zu (%.1f MiB)", type.c_str(), cb.first, static_cast<double>(cb.second) / (1 << 20));
  }
  const std::string overrides = text_or(f, image::keys::kTensorTypes, "");
  std::printf("%s%s\n", overrides.empty() ? "" : "; --tensor-type ", overrides.c_str());
  if (by_storage.count("INT4") != 0) {
    // What a load copies: the int8 layout is what the int8 kernels read (docs/image-format.md).
    std::printf("int4 layout   %zu of %zu in the int8 layout (%s %s), the rest plain\n", int8_layout,
                by_storage["INT4"].first, image::keys::kW4Int8Layout, text_or(f, image::keys::kW4Int8Layout, "-").c_str());
  }
}

int inspect(const std::string& arg) {
  // "default" (or $KESTREL_MODEL): the file `kestrel run` would load.
  const std::string path = runtime::runnable_model(arg, /*prefer_image=*/true).path.string();
  const gguf::File f = gguf::File::open(path);
  const auto info = image::read_image_info(f);
  std::printf("file          %s (%.1f MiB, GGUF v%u)\n", path.c_str(),
              static_cast<double>(f.file_size()) / (1 << 20), f.version());
  std::printf("kind          %s\n", info ? "Kestrel image" : "plain GGUF (not a Kestrel image)");
  std::printf("model         %s (%s)\n", text_or(f, "general.name").c_str(),
              text_or(f, "general.architecture").c_str());
  std::map<std::string, std::pair<size_t, uint64_t>> by_type;
  uint64_t params = 0;
  for (const auto& t : f.tensors()) {
    auto& [count, bytes] = by_type[gguf::tensor_type_name(t.type)];
    ++count;
    bytes += t.n_bytes;
    params += t.n_elements;
  }
  std::printf("tensors       %zu:", f.tensors().size());
  for (const auto& [type, cb] : by_type) {
    std::printf(" %s x%zu (%.1f MiB)", type.c_str(), cb.first, static_cast<double>(cb.second) / (1 << 20));
  }
  std::printf("\n");
  if (info) {
    namespace k = image::keys;
    std::printf("format        version %u\n", info->format_version);
    std::printf("precision     %s", quant::precision_name(info->precision));
    if (info->precision == quant::Precision::kW4A16) {
      std::printf(" (group size %zu, %s, %s, embedding/head %s)", info->group_size,
                  info->scale_bits == 8 ? "affine: 8-bit scale + min under fp16 per row"
                  : info->zero_points   ? "affine: scale + min"
                                        : "symmetric: scale only",
                  text_or(f, k::kQuantMethod).c_str(), text_or(f, k::kEmbeddingType).c_str());
    }
    std::printf("\n");
    if (info->precision == quant::Precision::kW4A16) print_layer_storage(f);
    std::printf("built         %s by Kestrel %s\n", text_or(f, k::kBuildDate).c_str(),
                text_or(f, k::kKestrelVersion).c_str());
    std::printf("source        %s (sha256 %s)\n", text_or(f, k::kSourceFile).c_str(),
                text_or(f, k::kSourceSha256).c_str());
    const std::string calib = text_or(f, k::kCalibrationSha256, "");
    std::printf("calibration   %s\n", calib.empty() ? "none" : calib.c_str());
    const std::string license = text_or(f, k::kLicenseText, "");
    std::printf("licence       %s; %zu bytes of licence/NOTICE text\n",
                text_or(f, "general.license").c_str(), license.size());
    if (const auto k_fh = f.find_uint(head::keys::kClusters)) {
      std::printf("flashhead     %llu clusters of %s tokens, default probes %s, radius weight %.3g\n",
                  static_cast<unsigned long long>(*k_fh), text_or(f, head::keys::kClusterSize).c_str(),
                  text_or(f, head::keys::kProbes).c_str(), f.find_float(head::keys::kRadiusWeight).value_or(0.0));
    } else {
      std::printf("flashhead     none (dense head only)\n");
    }
    if (const auto blocks = f.find_uint(image::mtp_keys::kBlockCount)) {  // what --draft auto drafts with
      std::printf("assistant     Gemma 4 MTP assistant, %llu layers, width %s (--draft auto drafts with it)\n",
                  static_cast<unsigned long long>(*blocks), text_or(f, image::mtp_keys::kEmbeddingLength).c_str());
    } else {
      std::printf("assistant     none (--draft auto drafts by prompt lookup)\n");
    }
    image::verify_content(f);
    std::printf("checksum      ok (xxh3 %016llx)\n",
                static_cast<unsigned long long>(f.get_uint(k::kContentHash)));
  } else {
    std::printf("parameters    %.1f M\n", static_cast<double>(params) / 1e6);
  }
  return 0;
}

}  // namespace

Command add_inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("inspect", "Summarize a model file and verify an image's checksum");
  cmd->add_option("model", *path, "GGUF file or Kestrel image ('default': the model `kestrel run` loads)")->required();
  return [path] { return inspect(*path); };
}

}  // namespace kestrel::tools
