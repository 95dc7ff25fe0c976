// GGUF v2/v3 reader: header, metadata, tensor infos, and an mmap of the tensor data.
//
// Format reference: ggml's docs/gguf.md (the GGUF specification) and gguf-py's
// gguf/gguf_reader.py. All integers are little-endian.
//
// Every malformed input raises `GgufError` with a specific `GgufErrorKind`; no input makes the
// reader crash, read out of bounds, or allocate without bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kestrel/base/error.h"

namespace kestrel::gguf {

/// Metadata value types, numbered as in the GGUF specification.
enum class ValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

/// Tensor data types, numbered as ggml's `enum ggml_type`.
enum class TensorType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15, kI8 = 24,
  kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kBF16 = 30,
};

enum class GgufErrorKind {
  kIo,                  // the file cannot be opened or mapped
  kTruncated,           // a read runs past the end of the file
  kBadMagic,            // the file does not start with "GGUF"
  kUnsupportedVersion,  // version other than 2 or 3
  kBadValueType,        // a metadata value type outside the specification
  kBadString,           // a string length larger than the remaining file
  kTooLarge,            // a count (keys, tensors, array elements, dims) over sane limits
  kDuplicateKey,        // the same metadata key twice
  kDuplicateTensor,     // the same tensor name twice
  kUnknownTensorType,   // a tensor type id Kestrel does not know
  kBadShape,            // zero or too many dimensions, a zero extent, or a row not a whole number of blocks
  kSizeOverflow,        // element count or byte size overflows 64 bits
  kBadAlignment,        // general.alignment not a power of two, or a tensor offset not aligned
  kOffsetOutOfRange,    // tensor data past the end of the file
  kMissingKey,          // a required metadata key or tensor is absent
  kTypeMismatch,        // a metadata value has another type than the caller asked for
};

/// Short stable name of an error kind, e.g. "truncated".
const char* error_kind_name(GgufErrorKind kind);

class GgufError : public Error {
 public:
  GgufError(GgufErrorKind kind, const std::string& message);
  GgufErrorKind kind() const { return kind_; }
  /// The message without the "GGUF <kind>: " prefix.
  const std::string& message() const { return message_; }

 private:
  GgufErrorKind kind_;
  std::string message_;
};

struct Value;
/// A metadata array. Arrays of scalars and strings are stored typed; nested arrays as `Value`s.
struct Array {
  ValueType element_type = ValueType::kUint8;
  std::variant<std::vector<int64_t>,      // all signed and unsigned integer types (uint64 > INT64_MAX is kept as its bit pattern)
               std::vector<double>,       // float32, float64
               std::vector<uint8_t>,      // bool
               std::vector<std::string>,  // string
               std::vector<Value>>        // array of arrays
      items;
  size_t size() const;
};

/// One metadata value. Scalars of every integer type are widened to int64/uint64; floats to double.
struct Value {
  ValueType type = ValueType::kUint8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<Array>> data;
};

struct TensorInfo {
  std::string name;
  TensorType type = TensorType::kF32;
  std::vector<uint64_t> shape;  // ggml order: shape[0] is the innermost (row length, contiguous)
  uint64_t offset = 0;          // from the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  uint64_t rows() const { return shape.empty() ? 0 : n_elements / shape[0]; }
};

/// A parsed GGUF file. Tensor data stays in the mapping; nothing is copied.
class File {
 public:
  /// Opens and maps `path` read-only and parses it. Throws GgufError.
  static File open(const std::filesystem::path& path);
  /// Parses a GGUF image held in memory (not copied; `bytes` must outlive the File). Throws GgufError.
  static File parse(std::span<const std::byte> bytes);

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  uint32_t version() const;
  uint64_t alignment() const;
  const std::filesystem::path& path() const;  // empty for parse()
  uint64_t file_size() const;

  /// Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const;
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters: throw GgufError kMissingKey if absent, kTypeMismatch if of another kind.
  // Integer getters accept any integer type whose value fits; get_float accepts float32/float64.
  uint64_t get_uint(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const Array& get_array(std::string_view key) const;
  // Optional variants: std::nullopt when absent; still kTypeMismatch when present with another type.
  std::optional<uint64_t> find_uint(std::string_view key) const;
  std::optional<double> find_float(std::string_view key) const;
  std::optional<bool> find_bool(std::string_view key) const;
  std::optional<std::string> find_string(std::string_view key) const;
  // Array helpers; kTypeMismatch if the array's elements are of another kind.
  const std::vector<std::string>& get_string_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const;
  const TensorInfo* find_tensor(std::string_view name) const;
  /// Throws GgufError kMissingKey if the tensor is absent.
  const TensorInfo& tensor(std::string_view name) const;
  /// The tensor's bytes inside the mapping (n_bytes long, bounds already checked at parse time).
  std::span<const std::byte> tensor_data(const TensorInfo& info) const;
  /// Drops the tensor's pages from this process's resident set (madvise MADV_DONTNEED on the
  /// whole pages inside it; a read afterwards pages them in again from the file). For streaming
  /// passes over files larger than memory, e.g. `kestrel build`. No effect for parse().
  void release(const TensorInfo& info) const;
  /// Maps the tensor's pages into this process's page table now (madvise MADV_POPULATE_READ,
  /// Linux 5.14; only advice: elsewhere the first read faults them in). For tensors a load keeps
  /// in place and the first product reads whole, e.g. an image's int8 layout. No effect for parse().
  void populate(const TensorInfo& info) const;

 private:
  struct Impl;
  explicit File(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel::gguf
