#include "kestrel/image/hf_compressed_tensors.h"

#include <cmath>
#include <cstring>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/quant/compressed_tensors.h"
#include "kestrel/quant/w4.h"

namespace kestrel::image {

using nlohmann::json;
namespace st = safetensors;

std::optional<CtScheme> compressed_tensors_scheme(const json& config, const std::string& where) {
  const json* q = nullptr;
  if (config.contains("quantization_config") && config["quantization_config"].is_object()) {
    q = &config["quantization_config"];
  } else if (config.contains("text_config") && config["text_config"].is_object() &&
             config["text_config"].contains("quantization_config") && config["text_config"]["quantization_config"].is_object()) {
    q = &config["text_config"]["quantization_config"];
  }
  for (const json* c : {&config, config.contains("text_config") ? &config["text_config"] : nullptr}) {
    if (c != nullptr && c->is_object() && c->contains("quantization_config") && !(*c)["quantization_config"].is_null() &&
        !(*c)["quantization_config"].is_object()) {
      throw Error(where + ": quantization_config is not a JSON object");
    }
  }
  if (q == nullptr) return std::nullopt;
  const std::string method = q->value("quant_method", "");
  if (method != "compressed-tensors") {
    throw Error(where + ": quantization_config.quant_method '" + method +
                "': kestrel build imports W4A16 checkpoints in the compressed-tensors (pack-quantized) format, and "
                "for Gemma 3 also AWQ (gemm) and GPTQ ones (docs/export.md)");
  }
  const std::string format = q->value("format", "");
  auto bad = [&](const std::string& what) {
    return Error(where + ": quantization_config " + what +
                 "; kestrel build imports 4-bit integer weights in groups (W4A16, pack-quantized) only");
  };
  if (!q->contains("config_groups") || !(*q)["config_groups"].is_object() || (*q)["config_groups"].empty()) {
    throw bad("has no config_groups");
  }
  std::optional<CtScheme> scheme;
  for (const auto& [name, g] : (*q)["config_groups"].items()) {
    if (!g.is_object() || !g.contains("weights") || !g["weights"].is_object()) throw bad("group " + name + " has no weights");
    const std::string group_format = g.contains("format") && g["format"].is_string() ? g["format"].get<std::string>() : format;
    if (group_format != "pack-quantized") throw bad("group " + name + " has format '" + group_format + "'");
    for (const char* act : {"input_activations", "output_activations"}) {
      if (g.contains(act) && !g[act].is_null()) throw bad("group " + name + " quantizes " + act);
    }
    const json& w = g["weights"];
    if (w.value("num_bits", 0) != 4 || w.value("type", "") != "int") throw bad("group " + name + " is not 4-bit int");
    if (w.value("strategy", "") != "group") throw bad("group " + name + " has strategy '" + w.value("strategy", "") + "'");
    if (w.contains("dynamic") && !w["dynamic"].is_null() && w["dynamic"] != false) throw bad("group " + name + " is dynamic");
    if (w.contains("actorder") && !w["actorder"].is_null() && w["actorder"] != false) {
      throw bad("group " + name + " uses activation ordering (g_idx)");
    }
    if (!w.contains("group_size") || !w["group_size"].is_number_unsigned() || w["group_size"].get<size_t>() == 0 ||
        w["group_size"].get<size_t>() % 32 != 0) {
      throw bad("group " + name + " has a group_size that is not a multiple of 32");
    }
    const CtScheme s{w["group_size"].get<size_t>(), w.value("symmetric", true)};
    if (scheme && (scheme->group_size != s.group_size || scheme->symmetric != s.symmetric)) {
      throw bad("groups differ in group size or symmetry");
    }
    scheme = s;
  }
  return scheme;
}

namespace {

template <typename T>
std::vector<T> read_as(const st::Checkpoint& ckpt, const std::string& name, st::Dtype dtype,
                       const std::vector<uint64_t>& shape) {
  const auto& info = ckpt.info(name);
  if (info.dtype != dtype || info.shape != shape) {
    throw Error(ckpt.dir().string() + ": tensor '" + name + "' is " + st::dtype_name(info.dtype) + " " +
                "of " + std::to_string(info.n_elements()) + " elements; expected " + st::dtype_name(dtype) +
                " of shape [" + std::to_string(shape[0]) + (shape.size() > 1 ? ", " + std::to_string(shape[1]) : std::string()) + "]");
  }
  const auto data = ckpt.data(name);
  std::vector<T> out(data.size() / sizeof(T));
  std::memcpy(out.data(), data.data(), out.size() * sizeof(T));
  return out;
}

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

}  // namespace

void write_ct_linear(gguf::Writer& w, const st::Checkpoint& ckpt, const std::string& hf_base, size_t rows,
                     size_t cols, const CtScheme& scheme, const std::function<void(const std::string&)>& log) {
  const size_t G = scheme.group_size, n_groups = cols / G;
  if (cols % G != 0) {
    throw Error(ckpt.dir().string() + ": " + hf_base + " has " + std::to_string(cols) + " inputs, not a multiple of the group size " +
                std::to_string(G));
  }
  const auto shape = read_as<int64_t>(ckpt, hf_base + ".weight_shape", st::Dtype::kI64, {2});
  if (shape[0] != static_cast<int64_t>(rows) || shape[1] != static_cast<int64_t>(cols)) {
    throw Error(ckpt.dir().string() + ": " + hf_base + ".weight_shape is [" + std::to_string(shape[0]) + ", " +
                std::to_string(shape[1]) + "], config.json implies [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  const auto packed = read_as<int32_t>(ckpt, hf_base + ".weight_packed", st::Dtype::kI32, {rows, cols / 8});
  w.write(bytes_of(quant::ct::unpack_weight(packed, rows, cols, G)));
  ckpt.release(hf_base + ".weight_packed");

  const std::string scale_name = hf_base + ".weight_scale";
  const auto& sinfo = ckpt.info(scale_name);
  if (sinfo.shape != std::vector<uint64_t>{rows, n_groups}) {
    throw Error(ckpt.dir().string() + ": " + scale_name + " has " + std::to_string(sinfo.n_elements()) +
                " elements, expected [" + std::to_string(rows) + ", " + std::to_string(n_groups) + "]");
  }
  std::vector<uint16_t> scales(rows * n_groups);
  size_t inexact = 0;
  const auto sdata = ckpt.data(scale_name);
  for (size_t i = 0; i < scales.size(); ++i) {
    uint16_t h = 0;
    float v = 0;
    switch (sinfo.dtype) {
      case st::Dtype::kF16: std::memcpy(&h, sdata.data() + 2 * i, 2); scales[i] = h; continue;
      case st::Dtype::kBF16: std::memcpy(&h, sdata.data() + 2 * i, 2); v = gguf::bf16_to_fp32(h); break;
      case st::Dtype::kF32: std::memcpy(&v, sdata.data() + 4 * i, 4); break;
      default: throw Error(ckpt.dir().string() + ": " + scale_name + " has dtype " + st::dtype_name(sinfo.dtype) + " (F16, BF16 or F32 expected)");
    }
    if (!(v >= 0.0f) || !std::isfinite(v)) throw Error(ckpt.dir().string() + ": " + scale_name + " holds a negative or non-finite scale");
    scales[i] = gguf::fp32_to_fp16(v);
    if (gguf::fp16_to_fp32(scales[i]) != v) ++inexact;
  }
  if (inexact > 0 && log) {
    log(hf_base + ": " + std::to_string(inexact) + " of " + std::to_string(scales.size()) +
        " scales are not exact in fp16 and were rounded");
  }
  w.write(bytes_of(scales));
  if (scheme.symmetric) return;
  const auto zp = read_as<int32_t>(ckpt, hf_base + ".weight_zero_point", st::Dtype::kI32, {(rows + 7) / 8, n_groups});
  const auto z = quant::ct::unpack_zero_points(zp, rows, n_groups);
  std::vector<uint16_t> mins(rows * n_groups);
  for (size_t i = 0; i < mins.size(); ++i) mins[i] = quant::integer_zero_point_min(scales[i], z[i]);
  w.write(bytes_of(mins));
}

CtRole ct_role(const std::string& name, const std::string& where) {
  if (name.ends_with(".weight_g_idx")) throw Error(where + ": activation ordering (g_idx) is not supported");
  if (name.ends_with(".weight_packed")) return CtRole::kPacked;
  if (name.ends_with(".weight_scale") || name.ends_with(".weight_zero_point") || name.ends_with(".weight_shape")) {
    return CtRole::kAuxiliary;
  }
  return CtRole::kOther;
}

}  // namespace kestrel::image
