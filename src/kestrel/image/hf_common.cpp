#include "kestrel/image/hf_common.h"

#include <algorithm>
#include <cstring>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"

namespace kestrel::image::hf {

namespace st = safetensors;

uint64_t get_uint(const nlohmann::json& c, const char* key, const std::string& where,
                  std::optional<uint64_t> fallback, uint64_t min_value) {
  if (!c.contains(key) || c[key].is_null()) {
    if (fallback) return *fallback;
    throw Error(where + " has no " + key);
  }
  if (!c[key].is_number_unsigned()) throw Error(where + ": " + key + " is not a non-negative integer");
  const uint64_t v = c[key].get<uint64_t>();
  if (v < min_value || v > (1u << 24)) {
    throw Error(where + ": " + key + " = " + std::to_string(v) + " is outside " + std::to_string(min_value) + "..16777216");
  }
  return v;
}

double get_float(const nlohmann::json& c, const char* key, const std::string& where, double fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  if (!c[key].is_number()) throw Error(where + ": " + key + " is not a number");
  return c[key].get<double>();
}

nlohmann::json read_tokenizer_config(const std::filesystem::path& dir) {
  nlohmann::json tc = nlohmann::json::object();
  if (std::filesystem::is_regular_file(dir / "tokenizer_config.json")) tc = st::read_json(dir / "tokenizer_config.json");
  if (!tc.is_object()) throw Error((dir / "tokenizer_config.json").string() + " is not a JSON object");
  return tc;
}

float element(const std::byte* p, st::Dtype dtype, size_t i) {
  switch (dtype) {
    case st::Dtype::kF32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
    case st::Dtype::kF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return gguf::fp16_to_fp32(h); }
    case st::Dtype::kBF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return gguf::bf16_to_fp32(h); }
    default: { double d; std::memcpy(&d, p + 8 * i, 8); return static_cast<float>(d); }
  }
}

std::string shape_str(const std::vector<uint64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

gguf::TensorType stored_type(const std::filesystem::path& dir, const std::string& name, st::Dtype dtype, bool one_d) {
  switch (dtype) {
    case st::Dtype::kF32: case st::Dtype::kF64: return gguf::TensorType::kF32;
    case st::Dtype::kF16: return one_d ? gguf::TensorType::kF32 : gguf::TensorType::kF16;
    case st::Dtype::kBF16: return one_d ? gguf::TensorType::kF32 : gguf::TensorType::kBF16;
    default:
      throw Error(dir.string() + ": tensor '" + name + "' has dtype " + st::dtype_name(dtype) +
                  "; kestrel build reads F32, F16, BF16 and F64");
  }
}

void write_tensor(gguf::Writer& w, std::span<const std::byte> data, st::Dtype dtype, uint64_t n_elements,
                  bool verbatim, float add) {
  if (verbatim) {
    w.write(data.first(static_cast<size_t>(n_elements * st::dtype_size(dtype))));
    return;
  }
  constexpr uint64_t kStep = 1 << 18;
  std::vector<float> buf;
  for (uint64_t i = 0; i < n_elements; i += kStep) {
    const size_t n = static_cast<size_t>(std::min(kStep, n_elements - i));
    buf.resize(n);
    for (size_t j = 0; j < n; ++j) {
      const size_t k = static_cast<size_t>(i) + j;
      if (dtype == st::Dtype::kF64 && add != 0.0f) {
        double d;
        std::memcpy(&d, data.data() + 8 * k, 8);
        buf[j] = static_cast<float>(d + static_cast<double>(add));
      } else {
        buf[j] = element(data.data(), dtype, k) + add;
      }
    }
    w.write({reinterpret_cast<const std::byte*>(buf.data()), n * sizeof(float)});
  }
}

}  // namespace kestrel::image::hf
