// Streaming GGUF v3 writer: metadata and tensor infos first, then tensor data written piece
// by piece, so a file larger than memory can be produced with one tensor in memory at a time.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/formats/gguf.h"

namespace kestrel::gguf {

class Writer {
 public:
  /// Tensor data is aligned to `alignment` bytes (written as general.alignment).
  Writer(std::filesystem::path path, uint64_t alignment);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  /// Metadata, in order. general.alignment is written by the writer itself.
  void add(std::string key, Value value);
  void add_string(std::string key, std::string value);
  void add_uint32(std::string key, uint32_t value);
  /// A uint64 whose value is known only at the end (e.g. a checksum); set it with patch().
  void add_placeholder_u64(std::string key);

  /// Declares a tensor; data must later be written in declaration order.
  void add_tensor(std::string name, TensorType type, std::vector<uint64_t> shape);

  /// Writes the header, metadata and tensor infos. Call once, after every add*.
  void begin_data();
  /// Appends bytes of the current tensor; moves to the next tensor once it is complete.
  /// Throws kestrel::Error when more bytes are written than the tensors declared.
  void write(std::span<const std::byte> bytes);
  /// The content hash of the file as written (see gguf::content_hash), leaving out the metadata
  /// key `exclude_key` (the key that will hold the hash).
  uint64_t content_hash(std::string_view exclude_key) const;
  /// Sets a placeholder's value.
  void patch(std::string_view key, uint64_t value);
  /// Checks that every tensor is complete and closes the file. Throws kestrel::Error.
  void finish();

 private:
  struct PendingTensor {
    std::string name;
    TensorType type;
    std::vector<uint64_t> shape;
    uint64_t n_bytes = 0;
    uint64_t offset = 0;
  };
  void put(const void* data, size_t n);
  void pad_to_alignment();

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  uint64_t alignment_;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<std::string> placeholders_;
  std::vector<std::pair<std::string, uint64_t>> placeholder_offsets_;
  std::vector<PendingTensor> tensors_;
  size_t current_ = 0;
  uint64_t written_in_current_ = 0;
  uint64_t position_ = 0;
  void* hash_state_ = nullptr;
  bool finished_ = false;
};

/// XXH3-64 over every metadata entry (key, type and encoded value, in file order) except
/// `exclude_key`, combined with XXH3-64 over every tensor's bytes in tensor order: what
/// Writer::content_hash() computed when the file was written. Any change to a value or a
/// tensor changes it. The tensors are read in pieces of 8 MiB, each dropped from the resident
/// set once hashed (as File::release does), so hashing a file larger than memory leaves it unmapped.
/// For a file mapping a second thread pages the next pieces in and the hashed ones out meanwhile
/// (joined before returning); the bytes hashed, and the hash, are the same.
uint64_t content_hash(const File& file, std::string_view exclude_key);

}  // namespace kestrel::gguf
