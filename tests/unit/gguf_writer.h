// Test utility: builds GGUF images in memory, well-formed or deliberately broken.
//
//   GgufWriter w;
//   w.kv("general.name", ValueType::kString, Bytes().str("tiny"));
//   w.tensor("a", TensorType::kF32, {4}, Bytes().f32(1).f32(2).f32(3).f32(4));
//   std::vector<std::byte> image = w.build();
//
// Every field the reader validates can be overridden (magic, version, counts, offsets, raw type
// ids), and `kv` takes raw payload bytes, so malformed values can be written too.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/formats/gguf.h"

namespace kestrel::gguf::testing {

/// A little-endian byte builder.
class Bytes {
 public:
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& i8(int8_t v) { return put(static_cast<uint8_t>(v)); }
  Bytes& u16(uint16_t v) { return put(v); }
  Bytes& i16(int16_t v) { return put(static_cast<uint16_t>(v)); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& i32(int32_t v) { return put(static_cast<uint32_t>(v)); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& i64(int64_t v) { return put(static_cast<uint64_t>(v)); }
  Bytes& f32(float v) { return put(std::bit_cast<uint32_t>(v)); }
  Bytes& f64(double v) { return put(std::bit_cast<uint64_t>(v)); }
  Bytes& type(ValueType t) { return u32(static_cast<uint32_t>(t)); }
  /// A GGUF string: u64 length, then the bytes.
  Bytes& str(std::string_view s) {
    u64(s.size());
    for (char c : s) bytes_.push_back(static_cast<std::byte>(c));
    return *this;
  }
  Bytes& append(const Bytes& other) {
    bytes_.insert(bytes_.end(), other.bytes_.begin(), other.bytes_.end());
    return *this;
  }
  Bytes& zeros(size_t n) {
    bytes_.resize(bytes_.size() + n);
    return *this;
  }

  size_t size() const { return bytes_.size(); }
  const std::vector<std::byte>& vec() const { return bytes_; }

 private:
  template <typename T>
  Bytes& put(T v) {
    for (size_t i = 0; i < sizeof(T); ++i) {
      bytes_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFF));
    }
    return *this;
  }

  std::vector<std::byte> bytes_;
};

class GgufWriter {
 public:
  static constexpr uint32_t kMagic = 0x46554747;  // "GGUF"

  uint32_t magic = kMagic;
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count;  // override of the header's counts
  std::optional<uint64_t> kv_count;
  uint64_t alignment = 32;  // padding used when building; add general.alignment yourself

  /// Adds a metadata entry: key, value type, then `payload` as the encoded value.
  GgufWriter& kv(std::string_view key, ValueType type, const Bytes& payload) {
    return kv_raw(key, static_cast<uint32_t>(type), payload);
  }
  /// Like kv, with a raw (possibly invalid) value type id.
  GgufWriter& kv_raw(std::string_view key, uint32_t type, const Bytes& payload) {
    metadata_.str(key).u32(type).append(payload);
    ++n_kv_;
    return *this;
  }

  /// Adds a tensor. Its data goes at the next aligned data offset unless `offset` is given.
  GgufWriter& tensor(std::string_view name, TensorType type, std::initializer_list<uint64_t> dims,
                     const Bytes& data, std::optional<uint64_t> offset = std::nullopt) {
    return tensor_raw(name, static_cast<uint32_t>(type), std::vector<uint64_t>(dims), data, offset);
  }
  /// Like tensor, with a raw type id and dims as a vector (any count).
  GgufWriter& tensor_raw(std::string_view name, uint32_t type, const std::vector<uint64_t>& dims,
                         const Bytes& data, std::optional<uint64_t> offset = std::nullopt) {
    pad_data();
    const uint64_t at = offset.value_or(data_.size());
    infos_.str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) infos_.u64(d);
    infos_.u32(type).u64(at);
    data_.append(data);
    ++n_tensors_;
    return *this;
  }

  /// The image: header, metadata, tensor infos, padding to `alignment`, data (no trailing pad).
  std::vector<std::byte> build() const {
    Bytes out;
    out.u32(magic).u32(version);
    out.u64(tensor_count.value_or(n_tensors_)).u64(kv_count.value_or(n_kv_));
    out.append(metadata_).append(infos_);
    if (n_tensors_ > 0 || data_.size() > 0) out.zeros(padding(out.size()));
    out.append(data_);
    return out.vec();
  }

 private:
  size_t padding(size_t at) const { return (alignment - at % alignment) % alignment; }
  void pad_data() { data_.zeros(padding(data_.size())); }

  Bytes metadata_;
  Bytes infos_;
  Bytes data_;
  uint64_t n_kv_ = 0;
  uint64_t n_tensors_ = 0;
};

/// Parses an image (helper for tests).
inline File parse_image(const std::vector<std::byte>& image) { return File::parse(image); }

}  // namespace kestrel::gguf::testing
