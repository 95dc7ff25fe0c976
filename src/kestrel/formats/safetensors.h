// Strict safetensors reader (https://github.com/huggingface/safetensors, "Format"): an 8-byte
// little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin,
// end]}, "__metadata__": {string: string}}, then the data area, which offsets are relative to.
//
// Every malformed input raises kestrel::Error naming the file (and the tensor where there is
// one); no input makes the reader crash, read out of bounds or allocate without bound.
// `Checkpoint` opens a Hugging Face checkpoint directory: config.json plus model.safetensors or
// the shards listed by model.safetensors.index.json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/base/error.h"

namespace kestrel::safetensors {

enum class Dtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

/// "F32", "BF16", ...
const char* dtype_name(Dtype dtype);
size_t dtype_size(Dtype dtype);

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<uint64_t> shape;  // row-major, outermost first (PyTorch order)
  uint64_t begin = 0;           // data_offsets, relative to the data area
  uint64_t end = 0;
  uint64_t n_elements() const;
  uint64_t n_bytes() const { return end - begin; }
};

/// One .safetensors file. Tensor data stays in the mapping.
class File {
 public:
  /// Opens and maps `path` read-only and validates it. Throws kestrel::Error.
  static File open(const std::filesystem::path& path);
  /// Validates a file held in memory (not copied; `bytes` must outlive the File); `name` is
  /// used in error messages. Throws kestrel::Error.
  static File parse(std::span<const std::byte> bytes, std::string name = "<memory>");

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const std::string& name() const;
  /// Tensors in data order (ascending begin offset).
  const std::vector<TensorInfo>& tensors() const;
  const std::map<std::string, std::string>& metadata() const;
  const TensorInfo* find(std::string_view name) const;
  std::span<const std::byte> data(const TensorInfo& info) const;
  /// Tells the kernel the tensor's pages are no longer needed (keeps peak RSS low when
  /// streaming a checkpoint). The data stays readable.
  void release(const TensorInfo& info) const;

 private:
  struct Impl;
  explicit File(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// A Hugging Face checkpoint directory: config.json and one or more safetensors files.
class Checkpoint {
 public:
  /// Throws kestrel::Error: no config.json, bad JSON, no safetensors file, an index naming a
  /// missing shard or a tensor absent from its shard, a tensor in two shards.
  static Checkpoint open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  bool has(std::string_view name) const;
  /// Throws kestrel::Error when absent.
  const TensorInfo& info(std::string_view name) const;
  std::span<const std::byte> data(std::string_view name) const;
  void release(std::string_view name) const;
  /// Sum of the safetensors files' sizes.
  uint64_t bytes() const { return bytes_; }
  const std::vector<std::filesystem::path>& files() const { return paths_; }

 private:
  std::filesystem::path dir_;
  nlohmann::json config_;
  std::vector<File> files_;
  std::vector<std::filesystem::path> paths_;
  std::map<std::string, std::pair<size_t, const TensorInfo*>, std::less<>> index_;
  uint64_t bytes_ = 0;
};

/// Reads a JSON file; throws kestrel::Error naming the file on I/O or parse errors.
nlohmann::json read_json(const std::filesystem::path& path);

}  // namespace kestrel::safetensors
