#include "kestrel/formats/safetensors_writer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "kestrel/base/error.h"

namespace kestrel::safetensors {

Writer::Writer(std::filesystem::path path) : path_(std::move(path)) {
  f_ = std::fopen(path_.c_str(), "wb");
  if (f_ == nullptr) throw Error("cannot create " + path_.string());
}

Writer::~Writer() {
  if (f_ != nullptr) std::fclose(f_);
}

void Writer::add_tensor(std::string name, Dtype dtype, std::vector<uint64_t> shape) {
  if (started_) throw Error("safetensors writer: tensor '" + name + "' declared after the header");
  if (std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; })) {
    throw Error("safetensors writer: tensor '" + name + "' declared twice");
  }
  uint64_t n = 1;
  for (const uint64_t d : shape) n *= d;
  entries_.push_back({std::move(name), dtype, std::move(shape), n * dtype_size(dtype)});
}

void Writer::set_metadata(std::map<std::string, std::string> metadata) { metadata_ = std::move(metadata); }

void Writer::begin_data() {
  if (started_) throw Error("safetensors writer: begin_data called twice");
  started_ = true;
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  total_ = offset;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  if (std::fwrite(len, 1, 8, f_) != 8 || std::fwrite(text.data(), 1, text.size(), f_) != text.size()) {
    throw Error("cannot write " + path_.string());
  }
}

void Writer::write(std::span<const std::byte> bytes) {
  if (!started_) throw Error("safetensors writer: data written before the header");
  if (written_ + bytes.size() > total_) {
    throw Error("safetensors writer: more bytes written than the tensors of " + path_.string() + " declare");
  }
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size()) {
    throw Error("cannot write " + path_.string() + " (disk full?)");
  }
  written_ += bytes.size();
}

void Writer::finish() {
  if (!started_ || written_ != total_) {
    throw Error("safetensors writer: " + std::to_string(written_) + " of " + std::to_string(total_) +
                " bytes written to " + path_.string());
  }
  const bool ok = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok) throw Error("cannot write " + path_.string());
}

}  // namespace kestrel::safetensors
