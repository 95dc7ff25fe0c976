#include "kestrel/formats/gguf_writer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>
#include <xxhash.h>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"

namespace kestrel::gguf {
namespace {

XXH3_state_t* state(void* p) { return static_cast<XXH3_state_t*>(p); }

}  // namespace

Writer::Writer(std::filesystem::path path, uint64_t alignment)
    : path_(std::move(path)), alignment_(alignment) {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
    throw Error("GGUF alignment must be a power of two");
  }
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) throw Error("cannot write " + path_.string() + ": " + std::strerror(errno));
  hash_state_ = XXH3_createState();
  XXH3_64bits_reset(state(hash_state_));
}

Writer::~Writer() {
  if (file_ != nullptr) std::fclose(file_);
  if (hash_state_ != nullptr) XXH3_freeState(state(hash_state_));
  if (!finished_) {
    std::error_code ec;
    std::filesystem::remove(path_, ec);  // never leave a half-written file behind
  }
}

void Writer::add(std::string key, Value value) { metadata_.emplace_back(std::move(key), std::move(value)); }

void Writer::add_string(std::string key, std::string value) {
  add(std::move(key), Value{ValueType::kString, std::move(value)});
}

void Writer::add_uint32(std::string key, uint32_t value) {
  add(std::move(key), Value{ValueType::kUint32, static_cast<uint64_t>(value)});
}

void Writer::add_placeholder_u64(std::string key) {
  placeholders_.push_back(key);
  add(std::move(key), Value{ValueType::kUint64, uint64_t{0}});
}

void Writer::add_tensor(std::string name, TensorType type, std::vector<uint64_t> shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  PendingTensor t{std::move(name), type, std::move(shape), 0, 0};
  t.n_bytes = n / block_elements(type) * block_bytes(type);
  tensors_.push_back(std::move(t));
}

void Writer::put(const void* data, size_t n) {
  if (n != 0 && std::fwrite(data, 1, n, file_) != n) {
    throw Error("cannot write " + path_.string() + ": " + std::strerror(errno));
  }
  position_ += n;
}

void Writer::pad_to_alignment() {
  static const std::byte zeros[256] = {};
  uint64_t pad = (alignment_ - position_ % alignment_) % alignment_;
  while (pad > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof(zeros)));
    put(zeros, n);
    pad -= n;
  }
}

namespace {

void put_bytes(std::vector<std::byte>& out, const void* data, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  if (n != 0) std::memcpy(out.data() + at, data, n);
}

template <typename T>
void put_scalar(std::vector<std::byte>& out, T v) {
  put_bytes(out, &v, sizeof(T));
}

void put_string(std::vector<std::byte>& out, const std::string& s) {
  put_scalar<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

void put_integer(std::vector<std::byte>& out, ValueType type, uint64_t bits) {
  switch (type) {
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kBool:
      return put_scalar<uint8_t>(out, static_cast<uint8_t>(bits));
    case ValueType::kUint16: case ValueType::kInt16:
      return put_scalar<uint16_t>(out, static_cast<uint16_t>(bits));
    case ValueType::kUint32: case ValueType::kInt32:
      return put_scalar<uint32_t>(out, static_cast<uint32_t>(bits));
    default:
      return put_scalar<uint64_t>(out, bits);
  }
}

void put_float(std::vector<std::byte>& out, ValueType type, double v) {
  if (type == ValueType::kFloat32) return put_scalar<float>(out, static_cast<float>(v));
  put_scalar<double>(out, v);
}

void put_value(std::vector<std::byte>& out, const Value& value);

void put_array(std::vector<std::byte>& out, const Array& a) {
  put_scalar<uint32_t>(out, static_cast<uint32_t>(a.element_type));
  put_scalar<uint64_t>(out, a.size());
  std::visit([&](const auto& items) {
    using V = std::decay_t<decltype(items)>;
    for (const auto& item : items) {
      if constexpr (std::is_same_v<V, std::vector<int64_t>>) put_integer(out, a.element_type, static_cast<uint64_t>(item));
      else if constexpr (std::is_same_v<V, std::vector<double>>) put_float(out, a.element_type, item);
      else if constexpr (std::is_same_v<V, std::vector<uint8_t>>) put_scalar<uint8_t>(out, item);
      else if constexpr (std::is_same_v<V, std::vector<std::string>>) put_string(out, item);
      else put_value(out, item);
    }
  }, a.items);
}

// Writes a value without its type tag (arrays carry their element type and count).
void put_value(std::vector<std::byte>& out, const Value& value) {
  std::visit([&](const auto& v) {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, uint64_t>) put_integer(out, value.type, v);
    else if constexpr (std::is_same_v<V, int64_t>) put_integer(out, value.type, static_cast<uint64_t>(v));
    else if constexpr (std::is_same_v<V, double>) put_float(out, value.type, v);
    else if constexpr (std::is_same_v<V, bool>) put_scalar<uint8_t>(out, v ? 1 : 0);
    else if constexpr (std::is_same_v<V, std::string>) put_string(out, v);
    else put_array(out, *v);
  }, value.data);
}

}  // namespace

void Writer::begin_data() {
  add(std::string("general.alignment"), Value{ValueType::kUint32, alignment_});
  std::vector<std::byte> head;
  put_scalar<uint32_t>(head, 0x46554747);  // "GGUF"
  put_scalar<uint32_t>(head, 3);
  put_scalar<uint64_t>(head, tensors_.size());
  put_scalar<uint64_t>(head, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    put_string(head, key);
    put_scalar<uint32_t>(head, static_cast<uint32_t>(value.type));
    if (std::find(placeholders_.begin(), placeholders_.end(), key) != placeholders_.end()) {
      placeholder_offsets_.emplace_back(key, head.size());
    }
    put_value(head, value);
  }
  uint64_t offset = 0;
  for (auto& t : tensors_) {
    t.offset = offset;
    offset += (t.n_bytes + alignment_ - 1) / alignment_ * alignment_;
    put_string(head, t.name);
    put_scalar<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    for (uint64_t d : t.shape) put_scalar<uint64_t>(head, d);
    put_scalar<uint32_t>(head, static_cast<uint32_t>(t.type));
    put_scalar<uint64_t>(head, t.offset);
  }
  put(head.data(), head.size());
  pad_to_alignment();
  while (current_ < tensors_.size() && tensors_[current_].n_bytes == 0) ++current_;
}

void Writer::write(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    if (current_ >= tensors_.size()) throw Error("GGUF writer: more tensor data than declared");
    const auto& t = tensors_[current_];
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes.size(), t.n_bytes - written_in_current_));
    put(bytes.data(), n);
    XXH3_64bits_update(state(hash_state_), bytes.data(), n);
    written_in_current_ += n;
    bytes = bytes.subspan(n);
    if (written_in_current_ == t.n_bytes) {
      pad_to_alignment();
      written_in_current_ = 0;
      ++current_;
      while (current_ < tensors_.size() && tensors_[current_].n_bytes == 0) ++current_;
    }
  }
}

namespace {

uint64_t metadata_hash(const std::vector<std::pair<std::string, Value>>& metadata,
                       std::string_view exclude_key) {
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  std::vector<std::byte> bytes;
  for (const auto& [key, value] : metadata) {
    if (key == exclude_key) continue;
    bytes.clear();
    put_string(bytes, key);
    put_scalar<uint32_t>(bytes, static_cast<uint32_t>(value.type));
    put_value(bytes, value);
    XXH3_64bits_update(s, bytes.data(), bytes.size());
  }
  const uint64_t h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return h;
}

uint64_t combine(uint64_t metadata, uint64_t tensors) {
  const uint64_t both[2] = {metadata, tensors};
  return XXH3_64bits(both, sizeof(both));
}

}  // namespace

uint64_t Writer::content_hash(std::string_view exclude_key) const {
  return combine(metadata_hash(metadata_, exclude_key), XXH3_64bits_digest(state(hash_state_)));
}

void Writer::patch(std::string_view key, uint64_t value) {
  for (const auto& [k, offset] : placeholder_offsets_) {
    if (k != key) continue;
    std::fflush(file_);
    const long here = std::ftell(file_);
    std::fseek(file_, static_cast<long>(offset), SEEK_SET);
    if (std::fwrite(&value, sizeof(value), 1, file_) != 1) throw Error("cannot patch " + path_.string());
    std::fseek(file_, here, SEEK_SET);
    return;
  }
  throw Error("GGUF writer: no placeholder named " + std::string(key));
}

void Writer::finish() {
  if (current_ != tensors_.size()) {
    throw Error("GGUF writer: tensor '" + tensors_[current_].name + "' is incomplete");
  }
  if (std::fflush(file_) != 0 || std::fclose(file_) != 0) {
    file_ = nullptr;
    throw Error("cannot write " + path_.string() + ": " + std::strerror(errno));
  }
  file_ = nullptr;
  finished_ = true;
}

namespace {

uintptr_t page_size() {
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<uintptr_t>(page) : 4096;
}

// Drops the whole pages inside `bytes`, a range of a read-only file mapping, from the resident
// set (File::release for part of a tensor). Never call it on anonymous memory: MADV_DONTNEED
// would zero it.
void drop_pages(std::span<const std::byte> bytes) {
  const uintptr_t page = page_size();
  const auto begin = reinterpret_cast<uintptr_t>(bytes.data());
  const uintptr_t lo = (begin + page - 1) / page * page;
  const uintptr_t hi = (begin + bytes.size()) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

// Maps the pages holding `bytes`, a range of a read-only file mapping, into the page table in one
// call (MADV_POPULATE_READ, Linux 5.14) instead of a page fault per few pages when they are read.
// Only advice: where the kernel refuses it the reader faults the pages in itself.
void populate_pages(std::span<const std::byte> bytes) {
#ifdef MADV_POPULATE_READ
  if (bytes.empty()) return;
  const uintptr_t page = page_size();
  const auto begin = reinterpret_cast<uintptr_t>(bytes.data());
  const uintptr_t lo = begin / page * page;
  madvise(reinterpret_cast<void*>(lo), begin + bytes.size() - lo, MADV_POPULATE_READ);
#else
  static_cast<void>(bytes);
#endif
}

/// Pages a file mapping in and out around a sequential reader, on a second thread: each piece is
/// populated shortly before the reader gets to it and dropped from the resident set once the
/// reader reports it done. For content_hash of an image in the page cache, page faults and
/// dropping cost as much as the hash itself; on another core they overlap it. The thread only
/// gives the kernel advice on a read-only file mapping, never touches the bytes, and drops only
/// pieces already read, so what the reader sees is the same with it and without it.
class PagingAhead {
 public:
  explicit PagingAhead(std::vector<std::span<const std::byte>> pieces)
      : pieces_(std::move(pieces)), thread_([this] { run(); }) {}
  PagingAhead(const PagingAhead&) = delete;
  PagingAhead& operator=(const PagingAhead&) = delete;
  /// Waits for the thread, which drops what is left once every piece is done (done(size)).
  ~PagingAhead() {
    done(pieces_.size());
    thread_.join();
  }

  /// The reader has finished pieces [0, n).
  void done(size_t n) {
    done_.store(n, std::memory_order_release);
    done_.notify_one();
  }

 private:
  // Pieces populated ahead of the reader: enough to keep it off page faults, few enough to keep
  // the resident set small.
  static constexpr size_t kPiecesAhead = 4;

  void run() {
    size_t dropped = 0;
    auto drop_done = [&](size_t done) {
      for (; dropped < done; ++dropped) drop_pages(pieces_[dropped]);
    };
    for (size_t next = 0; next < pieces_.size(); ++next) {
      size_t done = done_.load(std::memory_order_acquire);
      while (next >= done + kPiecesAhead) {
        drop_done(done);
        done_.wait(done, std::memory_order_acquire);
        done = done_.load(std::memory_order_acquire);
      }
      if (next >= done) populate_pages(pieces_[next]);  // else the reader got there first
      drop_done(done);
    }
    for (size_t done = done_.load(std::memory_order_acquire);; done = done_.load(std::memory_order_acquire)) {
      drop_done(done);
      if (done == pieces_.size()) return;
      done_.wait(done, std::memory_order_acquire);
    }
  }

  const std::vector<std::span<const std::byte>> pieces_;
  std::atomic<size_t> done_{0};
  std::thread thread_;  // last: starts once the members it reads exist
};

}  // namespace

uint64_t content_hash(const File& file, std::string_view exclude_key) {
  // In pieces, each released once hashed: verifying a 9.5 GB image at load must not leave the
  // whole file (e.g. a per-layer token table that is read one row per token) resident.
  constexpr size_t kPiece = size_t{8} << 20;
  std::vector<std::span<const std::byte>> pieces;
  for (const auto& t : file.tensors()) {
    const auto bytes = file.tensor_data(t);
    for (size_t at = 0; at < bytes.size(); at += kPiece) {
      pieces.push_back(bytes.subspan(at, std::min(kPiece, bytes.size() - at)));
    }
  }
  // A file mapping is paged in and out beside the hash; parse()'s caller's memory is left alone.
  std::optional<PagingAhead> paging;
  if (!file.path().empty()) paging.emplace(pieces);

  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  for (size_t i = 0; i < pieces.size(); ++i) {
    XXH3_64bits_update(s, pieces[i].data(), pieces[i].size());
    if (paging) paging->done(i + 1);
  }
  const uint64_t h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  paging.reset();  // every piece dropped before returning, as the callers expect
  return combine(metadata_hash(file.metadata(), exclude_key), h);
}

}  // namespace kestrel::gguf
