// GGUF reader. Parsing walks the image with a bounds-checked cursor; every count read from the
// file is checked against the bytes that remain before anything is reserved for it.
#include "kestrel/formats/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "kestrel/formats/dequant.h"

namespace kestrel::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;
// Smallest possible encodings, used to reject counts that cannot fit in the remaining bytes.
// A key-value pair: key length, value type, a one-byte value.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
// A tensor info: name length, n_dims, one dimension, type, offset.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

[[noreturn]] void fail(GgufErrorKind kind, const std::string& message) {
  throw GgufError(kind, message);
}

std::string in_quotes(std::string_view s) {
  std::string result;
  result.reserve(s.size() + 2);
  result.push_back('\'');
  result.append(s);
  result.push_back('\'');
  return result;
}

bool is_valid_value_type(uint32_t type) {
  return type <= static_cast<uint32_t>(ValueType::kFloat64);
}

// Every id that TensorType names (tensor_type_name knows exactly those).
bool is_known_tensor_type(uint32_t type) {
  return std::string_view(tensor_type_name(static_cast<TensorType>(type))) != "unknown";
}

const char* value_type_name(ValueType type) {
  static constexpr const char* kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                           "int32",  "float32", "bool",   "string", "array",
                                           "uint64", "int64",   "float64"};
  const auto index = static_cast<uint32_t>(type);
  return index < std::size(kNames) ? kNames[index] : "invalid";
}

// Bytes of the smallest encoding of one value of `type` (an array needs its type and count).
uint64_t min_value_bytes(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool: return 1;
    case ValueType::kUint16:
    case ValueType::kInt16: return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32: return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64: return 8;
    case ValueType::kString: return 8;
    case ValueType::kArray: return 4 + 8;
  }
  return 1;
}

bool is_integer(ValueType type) {
  return static_cast<uint32_t>(type) <= static_cast<uint32_t>(ValueType::kInt32) ||
         type == ValueType::kUint64 || type == ValueType::kInt64;
}

bool is_float(ValueType type) { return type == ValueType::kFloat32 || type == ValueType::kFloat64; }

// A bounds-checked little-endian reader over the file image. `context` names the item being
// parsed (a key or a tensor) for error messages.
class Cursor {
 public:
  explicit Cursor(std::span<const std::byte> bytes) : bytes_(bytes) {}

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return bytes_.size(); }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  void set_context(std::string context) { context_ = std::move(context); }
  const std::string& context() const { return context_; }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    using Bits = std::conditional_t<
        sizeof(T) == 1, uint8_t,
        std::conditional_t<sizeof(T) == 2, uint16_t,
                           std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
    Bits bits = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      bits = static_cast<Bits>(bits |
                               static_cast<Bits>(static_cast<Bits>(bytes_[pos_ + i]) << (8 * i)));
    }
    pos_ += sizeof(T);
    return std::bit_cast<T>(bits);
  }

  std::string read_string(const char* what) {
    const uint64_t length = read<uint64_t>(what);
    if (length > remaining()) {
      fail(GgufErrorKind::kBadString, std::string(what) + " of " + context_ + " at offset " +
                                          std::to_string(pos_ - 8) + " has length " +
                                          std::to_string(length) + " but only " +
                                          std::to_string(remaining()) + " bytes remain");
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
    pos_ += length;
    return s;
  }

  // Checks that `count` items of at least `min_bytes` each can fit in the remaining bytes.
  void check_count(uint64_t count, uint64_t min_bytes, const char* what) const {
    if (count > remaining() / min_bytes) {
      fail(GgufErrorKind::kTooLarge,
           std::string(what) + " of " + context_ + " is " + std::to_string(count) + ", but " +
               std::to_string(remaining()) + " remaining bytes hold at most " +
               std::to_string(remaining() / min_bytes));
    }
  }

 private:
  void need(uint64_t n, const char* what) const {
    if (n > remaining()) {
      fail(GgufErrorKind::kTruncated, std::string(what) + " of " + context_ + " at offset " +
                                          std::to_string(pos_) + " needs " + std::to_string(n) +
                                          " bytes, but the file ends at " +
                                          std::to_string(bytes_.size()));
    }
  }

  std::span<const std::byte> bytes_;
  uint64_t pos_ = 0;
  std::string context_ = "the header";
};

ValueType read_value_type(Cursor& cursor, const char* what) {
  const auto raw = cursor.read<uint32_t>(what);
  if (!is_valid_value_type(raw)) {
    fail(GgufErrorKind::kBadValueType, "" + std::string(what) + " of " + cursor.context() + " is " +
                                           std::to_string(raw) + " (valid: 0..12)");
  }
  return static_cast<ValueType>(raw);
}

Value read_value(Cursor& cursor, ValueType type, int depth);

// Reads one integer of `type` widened to int64 (uint64 keeps its bit pattern).
int64_t read_integer_bits(Cursor& cursor, ValueType type) {
  switch (type) {
    case ValueType::kUint8: return cursor.read<uint8_t>("uint8 value");
    case ValueType::kInt8: return cursor.read<int8_t>("int8 value");
    case ValueType::kUint16: return cursor.read<uint16_t>("uint16 value");
    case ValueType::kInt16: return cursor.read<int16_t>("int16 value");
    case ValueType::kUint32: return cursor.read<uint32_t>("uint32 value");
    case ValueType::kInt32: return cursor.read<int32_t>("int32 value");
    case ValueType::kUint64: return static_cast<int64_t>(cursor.read<uint64_t>("uint64 value"));
    default: return cursor.read<int64_t>("int64 value");
  }
}

double read_floating(Cursor& cursor, ValueType type) {
  if (type == ValueType::kFloat32) return cursor.read<float>("float32 value");
  return cursor.read<double>("float64 value");
}

template <typename T, typename ReadOne>
std::vector<T> read_items(uint64_t count, ReadOne read_one) {
  std::vector<T> items;
  items.reserve(count);
  for (uint64_t i = 0; i < count; ++i) items.push_back(read_one());
  return items;
}

std::shared_ptr<Array> read_array(Cursor& cursor, int depth) {
  if (depth >= kMaxArrayDepth) {
    fail(GgufErrorKind::kTooLarge, "arrays in " + cursor.context() + " nest deeper than " +
                                       std::to_string(kMaxArrayDepth) + " levels");
  }
  auto array = std::make_shared<Array>();
  const ValueType type = read_value_type(cursor, "array element type");
  const auto count = cursor.read<uint64_t>("array length");
  cursor.check_count(count, min_value_bytes(type), "array length");
  array->element_type = type;
  if (is_integer(type)) {
    array->items = read_items<int64_t>(count, [&] { return read_integer_bits(cursor, type); });
  } else if (is_float(type)) {
    array->items = read_items<double>(count, [&] { return read_floating(cursor, type); });
  } else if (type == ValueType::kBool) {
    array->items = read_items<uint8_t>(
        count, [&] { return static_cast<uint8_t>(cursor.read<uint8_t>("bool value") != 0); });
  } else if (type == ValueType::kString) {
    array->items = read_items<std::string>(count, [&] { return cursor.read_string("string"); });
  } else {
    array->items = read_items<Value>(count, [&] { return read_value(cursor, type, depth + 1); });
  }
  return array;
}

Value read_value(Cursor& cursor, ValueType type, int depth) {
  Value value;
  value.type = type;
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kUint16:
    case ValueType::kUint32:
    case ValueType::kUint64:
      value.data = static_cast<uint64_t>(read_integer_bits(cursor, type));
      break;
    case ValueType::kInt8:
    case ValueType::kInt16:
    case ValueType::kInt32:
    case ValueType::kInt64: value.data = read_integer_bits(cursor, type); break;
    case ValueType::kFloat32:
    case ValueType::kFloat64: value.data = read_floating(cursor, type); break;
    case ValueType::kBool: value.data = cursor.read<uint8_t>("bool value") != 0; break;
    case ValueType::kString: value.data = cursor.read_string("string value"); break;
    case ValueType::kArray: value.data = read_array(cursor, depth); break;
  }
  return value;
}

// Owns a read-only mapping of a whole file.
struct Mapping {
  void* address = nullptr;
  size_t length = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (address != nullptr) munmap(address, length);
  }
};

// Owns a file descriptor.
struct Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) close(fd);
  }
};

[[noreturn]] void fail_io(const std::filesystem::path& path, const char* action) {
  fail(GgufErrorKind::kIo,
       "cannot " + std::string(action) + " " + path.string() + ": " + std::strerror(errno));
}

std::unique_ptr<Mapping> map_file(const std::filesystem::path& path) {
  Descriptor file;
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (file.fd < 0) fail_io(path, "open");
  struct stat info {};
  if (fstat(file.fd, &info) != 0) fail_io(path, "stat");
  if (!S_ISREG(info.st_mode)) {
    fail(GgufErrorKind::kIo, "cannot read " + path.string() + ": not a regular file");
  }
  auto mapping = std::make_unique<Mapping>();
  if (info.st_size == 0) return mapping;  // nothing to map; parsing reports kTruncated
  mapping->length = static_cast<size_t>(info.st_size);
  void* address = mmap(nullptr, mapping->length, PROT_READ, MAP_PRIVATE, file.fd, 0);
  if (address == MAP_FAILED) fail_io(path, "mmap");
  mapping->address = address;
  return mapping;
}

}  // namespace

const char* error_kind_name(GgufErrorKind kind) {
  switch (kind) {
    case GgufErrorKind::kIo: return "io";
    case GgufErrorKind::kTruncated: return "truncated";
    case GgufErrorKind::kBadMagic: return "bad_magic";
    case GgufErrorKind::kUnsupportedVersion: return "unsupported_version";
    case GgufErrorKind::kBadValueType: return "bad_value_type";
    case GgufErrorKind::kBadString: return "bad_string";
    case GgufErrorKind::kTooLarge: return "too_large";
    case GgufErrorKind::kDuplicateKey: return "duplicate_key";
    case GgufErrorKind::kDuplicateTensor: return "duplicate_tensor";
    case GgufErrorKind::kUnknownTensorType: return "unknown_tensor_type";
    case GgufErrorKind::kBadShape: return "bad_shape";
    case GgufErrorKind::kSizeOverflow: return "size_overflow";
    case GgufErrorKind::kBadAlignment: return "bad_alignment";
    case GgufErrorKind::kOffsetOutOfRange: return "offset_out_of_range";
    case GgufErrorKind::kMissingKey: return "missing_key";
    case GgufErrorKind::kTypeMismatch: return "type_mismatch";
  }
  return "unknown";
}

GgufError::GgufError(GgufErrorKind kind, const std::string& message)
    : Error("GGUF " + std::string(error_kind_name(kind)) + ": " + message),
      kind_(kind),
      message_(message) {}

size_t Array::size() const {
  return std::visit([](const auto& list) { return list.size(); }, items);
}

struct File::Impl {
  std::filesystem::path path;
  std::unique_ptr<Mapping> mapping;  // null for parse()
  std::span<const std::byte> bytes;
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;  // start of the data section in the file
  std::vector<std::pair<std::string, Value>> metadata;
  std::map<std::string, size_t, std::less<>> key_index;
  std::vector<TensorInfo> tensors;
  std::map<std::string, size_t, std::less<>> tensor_index;

  void parse();
  void parse_header(Cursor& cursor, uint64_t* tensor_count, uint64_t* kv_count);
  void parse_metadata(Cursor& cursor, uint64_t kv_count);
  void read_alignment();
  void parse_tensor_infos(Cursor& cursor, uint64_t tensor_count);
  TensorInfo read_tensor_info(Cursor& cursor);
  void compute_sizes(TensorInfo& info) const;
  void locate_data(uint64_t end_of_infos);

  const Value& require(std::string_view key) const;
  [[noreturn]] void mismatch(std::string_view key, const Value& value, const char* wanted) const;
};

void File::Impl::parse() {
  Cursor cursor(bytes);
  uint64_t tensor_count = 0;
  uint64_t kv_count = 0;
  parse_header(cursor, &tensor_count, &kv_count);
  parse_metadata(cursor, kv_count);
  read_alignment();
  parse_tensor_infos(cursor, tensor_count);
  locate_data(cursor.pos());
}

void File::Impl::parse_header(Cursor& cursor, uint64_t* tensor_count, uint64_t* kv_count) {
  const auto magic = cursor.read<uint32_t>("magic");
  if (magic != kMagic) {
    char shown[5] = {};
    std::memcpy(shown, bytes.data(), 4);
    for (char& c : shown) {
      if (c != 0 && (c < 0x20 || c > 0x7e)) c = '?';
    }
    fail(GgufErrorKind::kBadMagic, "file starts with " + in_quotes(shown) + ", not 'GGUF'");
  }
  version = cursor.read<uint32_t>("version");
  if (version != 2 && version != 3) {
    fail(GgufErrorKind::kUnsupportedVersion,
         "unsupported version " + std::to_string(version) + " (Kestrel reads GGUF v2 and v3)");
  }
  *tensor_count = cursor.read<uint64_t>("tensor count");
  *kv_count = cursor.read<uint64_t>("metadata count");
  cursor.check_count(*kv_count, kMinKvBytes, "metadata count");
  cursor.check_count(*tensor_count, kMinTensorInfoBytes, "tensor count");
}

void File::Impl::parse_metadata(Cursor& cursor, uint64_t kv_count) {
  metadata.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    cursor.set_context("metadata entry " + std::to_string(i));
    std::string key = cursor.read_string("key");
    cursor.set_context("key " + in_quotes(key));
    const ValueType type = read_value_type(cursor, "value type");
    Value value = read_value(cursor, type, 0);
    if (!key_index.emplace(key, metadata.size()).second) {
      fail(GgufErrorKind::kDuplicateKey, "duplicate metadata key " + in_quotes(key));
    }
    metadata.emplace_back(std::move(key), std::move(value));
  }
}

void File::Impl::read_alignment() {
  const auto it = key_index.find("general.alignment");
  if (it == key_index.end()) return;
  const Value& value = metadata[it->second].second;
  const auto* unsigned_value = std::get_if<uint64_t>(&value.data);
  if (unsigned_value == nullptr) {
    fail(GgufErrorKind::kTypeMismatch, std::string("general.alignment has type ") +
                                           value_type_name(value.type) +
                                           ", not an unsigned integer");
  }
  if (!std::has_single_bit(*unsigned_value)) {
    fail(GgufErrorKind::kBadAlignment,
         "general.alignment " + std::to_string(*unsigned_value) + " is not a power of two");
  }
  alignment = *unsigned_value;
}

void File::Impl::parse_tensor_infos(Cursor& cursor, uint64_t tensor_count) {
  tensors.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    cursor.set_context("tensor info " + std::to_string(i));
    TensorInfo info = read_tensor_info(cursor);
    if (!tensor_index.emplace(info.name, tensors.size()).second) {
      fail(GgufErrorKind::kDuplicateTensor, "duplicate tensor name " + in_quotes(info.name));
    }
    tensors.push_back(std::move(info));
  }
}

TensorInfo File::Impl::read_tensor_info(Cursor& cursor) {
  TensorInfo info;
  info.name = cursor.read_string("name");
  cursor.set_context("tensor " + in_quotes(info.name));
  const auto n_dims = cursor.read<uint32_t>("n_dims");
  if (n_dims == 0 || n_dims > kMaxDims) {
    fail(GgufErrorKind::kBadShape, "tensor " + in_quotes(info.name) + " has " +
                                       std::to_string(n_dims) + " dimensions (1..4 allowed)");
  }
  info.shape.reserve(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) info.shape.push_back(cursor.read<uint64_t>("dimension"));
  const auto type = cursor.read<uint32_t>("type");
  if (!is_known_tensor_type(type)) {
    fail(GgufErrorKind::kUnknownTensorType,
         "tensor " + in_quotes(info.name) + " has unknown type id " + std::to_string(type));
  }
  info.type = static_cast<TensorType>(type);
  info.offset = cursor.read<uint64_t>("data offset");
  compute_sizes(info);
  return info;
}

void File::Impl::compute_sizes(TensorInfo& info) const {
  uint64_t elements = 1;
  for (size_t d = 0; d < info.shape.size(); ++d) {
    if (info.shape[d] == 0) {
      fail(GgufErrorKind::kBadShape,
           "tensor " + in_quotes(info.name) + " has extent 0 in dimension " + std::to_string(d));
    }
    if (__builtin_mul_overflow(elements, info.shape[d], &elements)) {
      fail(GgufErrorKind::kSizeOverflow,
           "element count of tensor " + in_quotes(info.name) + " overflows 64 bits");
    }
  }
  const uint64_t block = block_elements(info.type);
  if (info.shape[0] % block != 0) {
    fail(GgufErrorKind::kBadShape, "row length " + std::to_string(info.shape[0]) + " of tensor " +
                                       in_quotes(info.name) + " is not a multiple of " +
                                       tensor_type_name(info.type) + "'s block size " +
                                       std::to_string(block));
  }
  info.n_elements = elements;
  if (__builtin_mul_overflow(elements / block, uint64_t{block_bytes(info.type)}, &info.n_bytes)) {
    fail(GgufErrorKind::kSizeOverflow,
         "byte size of tensor " + in_quotes(info.name) + " overflows 64 bits");
  }
}

void File::Impl::locate_data(uint64_t end_of_infos) {
  const uint64_t padding = (alignment - end_of_infos % alignment) % alignment;
  if (padding > bytes.size() - end_of_infos) {
    if (!tensors.empty()) {
      fail(GgufErrorKind::kTruncated, "the file ends at " + std::to_string(bytes.size()) +
                                          ", inside the padding before the data section at " +
                                          std::to_string(end_of_infos) + " + " +
                                          std::to_string(padding));
    }
    data_offset = bytes.size();
    return;
  }
  data_offset = end_of_infos + padding;
  const uint64_t data_size = bytes.size() - data_offset;
  for (const TensorInfo& info : tensors) {
    if (info.offset % alignment != 0) {
      fail(GgufErrorKind::kBadAlignment, "offset " + std::to_string(info.offset) + " of tensor " +
                                             in_quotes(info.name) + " is not a multiple of " +
                                             std::to_string(alignment));
    }
    if (info.offset > data_size || info.n_bytes > data_size - info.offset) {
      fail(GgufErrorKind::kOffsetOutOfRange,
           "tensor " + in_quotes(info.name) + " (offset " + std::to_string(info.offset) + ", " +
               std::to_string(info.n_bytes) + " bytes) ends past the data section (" +
               std::to_string(data_size) + " bytes from file offset " +
               std::to_string(data_offset) + ")");
    }
  }
}

const Value& File::Impl::require(std::string_view key) const {
  const auto it = key_index.find(key);
  if (it == key_index.end())
    fail(GgufErrorKind::kMissingKey, "missing metadata key " + in_quotes(key));
  return metadata[it->second].second;
}

void File::Impl::mismatch(std::string_view key, const Value& value, const char* wanted) const {
  std::string type = value_type_name(value.type);
  if (const auto* array = std::get_if<std::shared_ptr<Array>>(&value.data)) {
    type += " of " + std::string(value_type_name((*array)->element_type));
  }
  fail(GgufErrorKind::kTypeMismatch,
       "metadata key " + in_quotes(key) + " has type " + type + ", wanted " + wanted);
}

File File::open(const std::filesystem::path& path) {
  std::unique_ptr<Mapping> mapping = map_file(path);
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->bytes = {static_cast<const std::byte*>(mapping->address), mapping->length};
  impl->mapping = std::move(mapping);
  try {
    impl->parse();
  } catch (const GgufError& e) {
    throw GgufError(e.kind(), path.string() + ": " + e.message());
  }
  return File(std::move(impl));
}

File File::parse(std::span<const std::byte> bytes) {
  auto impl = std::make_unique<Impl>();
  impl->bytes = bytes;
  impl->parse();
  return File(std::move(impl));
}

File::File(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

uint32_t File::version() const { return impl_->version; }
uint64_t File::alignment() const { return impl_->alignment; }
const std::filesystem::path& File::path() const { return impl_->path; }
uint64_t File::file_size() const { return impl_->bytes.size(); }

const std::vector<std::pair<std::string, Value>>& File::metadata() const { return impl_->metadata; }

const Value* File::find(std::string_view key) const {
  const auto it = impl_->key_index.find(key);
  return it == impl_->key_index.end() ? nullptr : &impl_->metadata[it->second].second;
}

uint64_t File::get_uint(std::string_view key) const {
  const Value& value = impl_->require(key);
  if (const auto* u = std::get_if<uint64_t>(&value.data)) return *u;
  if (const auto* i = std::get_if<int64_t>(&value.data); i != nullptr && *i >= 0) {
    return static_cast<uint64_t>(*i);
  }
  impl_->mismatch(key, value, "a non-negative integer");
}

int64_t File::get_int(std::string_view key) const {
  const Value& value = impl_->require(key);
  if (const auto* i = std::get_if<int64_t>(&value.data)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&value.data);
      u != nullptr && *u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(*u);
  }
  impl_->mismatch(key, value, "an integer that fits int64");
}

double File::get_float(std::string_view key) const {
  const Value& value = impl_->require(key);
  if (const auto* d = std::get_if<double>(&value.data)) return *d;
  impl_->mismatch(key, value, "float32 or float64");
}

bool File::get_bool(std::string_view key) const {
  const Value& value = impl_->require(key);
  if (const auto* b = std::get_if<bool>(&value.data)) return *b;
  impl_->mismatch(key, value, "bool");
}

const std::string& File::get_string(std::string_view key) const {
  const Value& value = impl_->require(key);
  if (const auto* s = std::get_if<std::string>(&value.data)) return *s;
  impl_->mismatch(key, value, "string");
}

const Array& File::get_array(std::string_view key) const {
  const Value& value = impl_->require(key);
  if (const auto* a = std::get_if<std::shared_ptr<Array>>(&value.data)) return **a;
  impl_->mismatch(key, value, "array");
}

std::optional<uint64_t> File::find_uint(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_uint(key);
}

std::optional<double> File::find_float(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_float(key);
}

std::optional<bool> File::find_bool(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_bool(key);
}

std::optional<std::string> File::find_string(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_string(key);
}

const std::vector<std::string>& File::get_string_array(std::string_view key) const {
  const Array& array = get_array(key);
  if (const auto* items = std::get_if<std::vector<std::string>>(&array.items)) return *items;
  impl_->mismatch(key, impl_->require(key), "array of string");
}

std::vector<float> File::get_float_array(std::string_view key) const {
  const Array& array = get_array(key);
  const auto* items = std::get_if<std::vector<double>>(&array.items);
  if (items == nullptr) impl_->mismatch(key, impl_->require(key), "array of float");
  std::vector<float> result;
  result.reserve(items->size());
  for (double item : *items) result.push_back(static_cast<float>(item));
  return result;
}

std::vector<int64_t> File::get_int_array(std::string_view key) const {
  const Array& array = get_array(key);
  if (const auto* items = std::get_if<std::vector<int64_t>>(&array.items)) return *items;
  impl_->mismatch(key, impl_->require(key), "array of integer");
}

const std::vector<TensorInfo>& File::tensors() const { return impl_->tensors; }

const TensorInfo* File::find_tensor(std::string_view name) const {
  const auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

const TensorInfo& File::tensor(std::string_view name) const {
  const TensorInfo* info = find_tensor(name);
  if (info == nullptr) fail(GgufErrorKind::kMissingKey, "missing tensor " + in_quotes(name));
  return *info;
}

std::span<const std::byte> File::tensor_data(const TensorInfo& info) const {
  const uint64_t data_size = impl_->bytes.size() - impl_->data_offset;
  if (info.offset > data_size || info.n_bytes > data_size - info.offset) {
    fail(GgufErrorKind::kOffsetOutOfRange,
         "tensor " + in_quotes(info.name) + " does not lie in this file's data");
  }
  return impl_->bytes.subspan(impl_->data_offset + info.offset, info.n_bytes);
}

void File::release(const TensorInfo& info) const {
  if (impl_->mapping == nullptr || impl_->mapping->address == nullptr) return;
  const long page_l = sysconf(_SC_PAGESIZE);
  const uint64_t page = page_l > 0 ? static_cast<uint64_t>(page_l) : 4096;
  const auto data = tensor_data(info);
  const auto* base = static_cast<const std::byte*>(impl_->mapping->address);
  const auto begin = static_cast<uint64_t>(data.data() - base);
  const uint64_t lo = (begin + page - 1) / page * page;
  const uint64_t hi = (begin + data.size()) / page * page;
  if (hi > lo) madvise(static_cast<char*>(impl_->mapping->address) + lo, hi - lo, MADV_DONTNEED);
}

void File::populate(const TensorInfo& info) const {
#ifdef MADV_POPULATE_READ
  if (impl_->mapping == nullptr || impl_->mapping->address == nullptr || info.n_bytes == 0) return;
  const long page_l = sysconf(_SC_PAGESIZE);
  const uint64_t page = page_l > 0 ? static_cast<uint64_t>(page_l) : 4096;
  const auto data = tensor_data(info);
  const auto* base = static_cast<const std::byte*>(impl_->mapping->address);
  const auto begin = static_cast<uint64_t>(data.data() - base);
  const uint64_t lo = begin / page * page;
  madvise(static_cast<char*>(impl_->mapping->address) + lo, begin + data.size() - lo, MADV_POPULATE_READ);
#else
  static_cast<void>(info);
#endif
}

}  // namespace kestrel::gguf
