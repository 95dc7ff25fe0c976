// Streaming safetensors writer (the format safetensors.h reads): tensors are declared first,
// then their bytes are written in declaration order, so a file larger than memory can be
// produced with one tensor in memory at a time.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kestrel/formats/safetensors.h"

namespace kestrel::safetensors {

class Writer {
 public:
  /// Creates (truncates) `path`. Throws kestrel::Error when it cannot be opened.
  explicit Writer(std::filesystem::path path);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  /// Declares a tensor (`shape` outermost first, as PyTorch); data follows in declaration
  /// order. Throws kestrel::Error for a duplicate name or a call after begin_data().
  void add_tensor(std::string name, Dtype dtype, std::vector<uint64_t> shape);
  /// String metadata ("__metadata__"), e.g. {"format": "pt"}.
  void set_metadata(std::map<std::string, std::string> metadata);
  /// Writes the header (JSON padded with spaces to a multiple of 8 bytes). Call once.
  void begin_data();
  /// Appends bytes of the current tensor, moving on when it is complete. Throws kestrel::Error
  /// when more bytes are written than were declared.
  void write(std::span<const std::byte> bytes);
  /// Checks every declared byte was written and closes the file. Throws kestrel::Error.
  void finish();

 private:
  struct Entry {
    std::string name;
    Dtype dtype;
    std::vector<uint64_t> shape;
    uint64_t bytes;
  };
  std::filesystem::path path_;
  std::FILE* f_ = nullptr;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
  bool started_ = false;
  uint64_t total_ = 0, written_ = 0;
};

}  // namespace kestrel::safetensors
