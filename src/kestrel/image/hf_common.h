// What the Hugging Face checkpoint converters (hf_gemma3.cpp, hf_gemma4.cpp) share: GGUF value
// makers, config.json field readers with clear errors, and streaming a safetensors tensor into
// a GGUF as written or as float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/formats/gguf.h"
#include "kestrel/formats/gguf_writer.h"
#include "kestrel/formats/safetensors.h"

namespace kestrel::image::hf {

inline gguf::Value u32(uint64_t v) { return gguf::Value{gguf::ValueType::kUint32, v}; }
/// Rounded to float32 first, as the file stores it.
inline gguf::Value f32(double v) {
  return gguf::Value{gguf::ValueType::kFloat32, static_cast<double>(static_cast<float>(v))};
}
inline gguf::Value boolean(bool v) { return gguf::Value{gguf::ValueType::kBool, v}; }
inline gguf::Value str(std::string v) { return gguf::Value{gguf::ValueType::kString, std::move(v)}; }
template <typename T>
gguf::Value array(gguf::ValueType element, std::vector<T> items) {
  auto a = std::make_shared<gguf::Array>();
  a->element_type = element;
  a->items = std::move(items);
  return gguf::Value{gguf::ValueType::kArray, a};
}

/// c[key] as an integer in min_value..2^24; `fallback` when absent or null. Throws
/// kestrel::Error naming `where` (the config file) when absent without a fallback, not an
/// integer, or out of that range.
uint64_t get_uint(const nlohmann::json& c, const char* key, const std::string& where,
                  std::optional<uint64_t> fallback = std::nullopt, uint64_t min_value = 1);

/// c[key] as a number; `fallback` when absent or null. Throws kestrel::Error when not a number.
double get_float(const nlohmann::json& c, const char* key, const std::string& where, double fallback);

/// dir/tokenizer_config.json as an object ({} when the file is absent). Throws kestrel::Error
/// when it is not a JSON object.
nlohmann::json read_tokenizer_config(const std::filesystem::path& dir);

/// Element i of a tensor of `dtype` (F32, F16, BF16, F64) as float32.
float element(const std::byte* data, safetensors::Dtype dtype, size_t i);

/// "[a, b]" for error messages.
std::string shape_str(const std::vector<uint64_t>& shape);

/// The GGUF type a checkpoint tensor of `dtype` is written as: F32/F64 as F32, F16 and BF16 as
/// stored, except that 1-D tensors (norms, scalars) become F32. Throws kestrel::Error naming
/// `dir` and the tensor `name` for any other dtype.
gguf::TensorType stored_type(const std::filesystem::path& dir, const std::string& name, safetensors::Dtype dtype,
                             bool one_d);

/// Writes the first `n_elements` of a tensor: as stored when `verbatim`, else as float32 with
/// `add` added to each element (Gemma 3's norms store w, llama.cpp's files 1 + w; the sum in
/// float32 as the converter does it, F64 sources summed in double), in bounded chunks.
void write_tensor(gguf::Writer& w, std::span<const std::byte> data, safetensors::Dtype dtype,
                  uint64_t n_elements, bool verbatim, float add = 0.0f);

}  // namespace kestrel::image::hf
