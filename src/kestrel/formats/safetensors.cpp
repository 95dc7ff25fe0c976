#include "kestrel/formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace kestrel::safetensors {
namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // the reference implementation's limit
constexpr size_t kMaxDims = 8;

struct DtypeEntry {
  const char* name;
  Dtype dtype;
  size_t size;
};
constexpr DtypeEntry kDtypes[] = {
    {"F64", Dtype::kF64, 8}, {"F32", Dtype::kF32, 4}, {"F16", Dtype::kF16, 2},
    {"BF16", Dtype::kBF16, 2}, {"I64", Dtype::kI64, 8}, {"I32", Dtype::kI32, 4},
    {"I16", Dtype::kI16, 2}, {"I8", Dtype::kI8, 1}, {"U8", Dtype::kU8, 1},
    {"BOOL", Dtype::kBool, 1},
};

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw Error("safetensors " + file + ": " + what);
}

uint64_t as_u64(const nlohmann::json& v, const std::string& file, const std::string& what) {
  if (!v.is_number_unsigned()) fail(file, what + " is not a non-negative integer");
  return v.get<uint64_t>();
}

}  // namespace

const char* dtype_name(Dtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

size_t dtype_size(Dtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

uint64_t TensorInfo::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // bounded at parse time
  return n;
}

struct File::Impl {
  std::string name;
  void* map = nullptr;
  size_t map_size = 0;
  std::span<const std::byte> bytes;
  uint64_t data_start = 0;
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  std::map<std::string, size_t, std::less<>> by_name;
  ~Impl() {
    if (map != nullptr) munmap(map, map_size);
  }
};

File::File(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

const std::string& File::name() const { return impl_->name; }
const std::vector<TensorInfo>& File::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& File::metadata() const { return impl_->metadata; }

const TensorInfo* File::find(std::string_view name) const {
  const auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}

std::span<const std::byte> File::data(const TensorInfo& info) const {
  return impl_->bytes.subspan(impl_->data_start + info.begin, info.n_bytes());
}

void File::release(const TensorInfo& info) const {
  if (impl_->map == nullptr) return;
  const long page_l = sysconf(_SC_PAGESIZE);
  const uint64_t page = page_l > 0 ? static_cast<uint64_t>(page_l) : 4096;
  const uint64_t lo = (impl_->data_start + info.begin + page - 1) / page * page;
  const uint64_t hi = (impl_->data_start + info.end) / page * page;
  if (hi > lo) madvise(static_cast<char*>(impl_->map) + lo, hi - lo, MADV_DONTNEED);
}

File File::parse(std::span<const std::byte> bytes, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->name = std::move(name);
  impl->bytes = bytes;
  const std::string& f = impl->name;
  if (bytes.size() < 8) {
    fail(f, "file of " + std::to_string(bytes.size()) + " bytes is too short for the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  if (n > kMaxHeader) fail(f, "header length " + std::to_string(n) + " exceeds the 100 MiB limit");
  if (n > bytes.size() - 8) {
    fail(f, "header length " + std::to_string(n) + " runs past the end of the file (" +
                std::to_string(bytes.size()) + " bytes): truncated or not a safetensors file");
  }
  if (n < 2) fail(f, "header length " + std::to_string(n) + " is too short for a JSON object");
  impl->data_start = 8 + n;
  const uint64_t data_size = bytes.size() - impl->data_start;
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<size_t>(n));

  // Duplicate top-level keys: nlohmann keeps the last silently, so watch the keys as they come.
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(
        text.begin(), text.end(),
        [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string()) {
            const auto& k = parsed.get_ref<const std::string&>();
            if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
          }
          return true;
        },
        true, false);
  } catch (const nlohmann::json::exception& e) {
    fail(f, std::string("header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) fail(f, "tensor '" + duplicate + "' is listed twice in the header");
  if (!header.is_object()) fail(f, "header is not a JSON object");

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail(f, "__metadata__ is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail(f, "__metadata__ value '" + mk + "' is not a string");
        impl->metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + key + "'";
    if (!value.is_object()) fail(f, where + " is not an object");
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(field)) fail(f, where + " has no " + field);
    }
    TensorInfo t;
    t.name = key;
    const auto& dt = value["dtype"];
    if (!dt.is_string()) fail(f, where + ": dtype is not a string");
    const auto dts = dt.get<std::string>();
    const auto* entry = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                     [&](const DtypeEntry& e) { return dts == e.name; });
    if (entry == std::end(kDtypes)) fail(f, where + " has unknown dtype '" + dts + "'");
    t.dtype = entry->dtype;
    const auto& shape = value["shape"];
    if (!shape.is_array()) fail(f, where + ": shape is not an array");
    if (shape.size() > kMaxDims) fail(f, where + " has " + std::to_string(shape.size()) + " dimensions (at most 8)");
    // Element count, guarded against overflow (every extent is bounded by the data size).
    uint64_t elements = 1;
    bool overflow = false;
    for (const auto& d : shape) {
      const uint64_t e = as_u64(d, f, where + ": a shape extent");
      t.shape.push_back(e);
      if (e != 0 && elements > UINT64_MAX / e) overflow = true;
      elements = overflow ? 0 : elements * e;
    }
    const auto& off = value["data_offsets"];
    if (!off.is_array() || off.size() != 2) fail(f, where + ": data_offsets is not [begin, end]");
    t.begin = as_u64(off[0], f, where + ": data_offsets begin");
    t.end = as_u64(off[1], f, where + ": data_offsets end");
    if (t.end < t.begin) fail(f, where + ": data_offsets end " + std::to_string(t.end) + " < begin " + std::to_string(t.begin));
    if (t.end > data_size) {
      fail(f, where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                  "] run past the data area of " + std::to_string(data_size) + " bytes (truncated file?)");
    }
    if (overflow || elements > UINT64_MAX / entry->size || elements * entry->size != t.n_bytes()) {
      std::ostringstream s;
      s << where << ": shape [";
      for (size_t i = 0; i < t.shape.size(); ++i) s << (i ? ", " : "") << t.shape[i];
      s << "] of " << dts << " needs " << (overflow ? std::string("more than 2^64") : std::to_string(elements * entry->size))
        << " bytes, data_offsets give " << t.n_bytes();
      fail(f, s.str());
    }
    impl->tensors.push_back(std::move(t));
  }
  std::sort(impl->tensors.begin(), impl->tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  for (size_t i = 0; i < impl->tensors.size(); ++i) {
    const auto& t = impl->tensors[i];
    if (i > 0) {
      const auto& p = impl->tensors[i - 1];
      // Empty tensors occupy no bytes and may share an offset.
      if (t.begin < p.end && t.n_bytes() > 0 && p.n_bytes() > 0) {
        fail(f, "tensors '" + p.name + "' [" + std::to_string(p.begin) + ", " + std::to_string(p.end) +
                    ") and '" + t.name + "' [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ") overlap");
      }
    }
    impl->by_name.emplace(t.name, i);
  }
  return File(std::move(impl));
}

File File::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("safetensors " + path.string() + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("safetensors " + path.string() + ": not a regular file");
  }
  const auto size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      ::close(fd);
      throw Error("safetensors " + path.string() + ": cannot map: " + std::strerror(errno));
    }
  }
  ::close(fd);
  std::span<const std::byte> bytes(static_cast<const std::byte*>(map), size);
  try {
    File file = parse(bytes, path.string());
    file.impl_->map = map;
    file.impl_->map_size = size;
    return file;
  } catch (...) {
    if (map != nullptr) munmap(map, size);
    throw;
  }
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path.string() + " is not valid JSON: " + e.what());
  }
}

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  Checkpoint c;
  c.dir_ = dir;
  if (!std::filesystem::is_directory(dir)) throw Error(dir.string() + " is not a directory");
  const auto config = dir / "config.json";
  if (!std::filesystem::is_regular_file(config)) {
    throw Error(dir.string() + " has no config.json: not a Hugging Face checkpoint");
  }
  c.config_ = read_json(config);
  if (!c.config_.is_object()) throw Error(config.string() + " is not a JSON object");

  const auto index_path = dir / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  if (std::filesystem::is_regular_file(index_path)) {
    const auto index = read_json(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw Error(index_path.string() + " has no weight_map object");
    }
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) throw Error(index_path.string() + ": weight_map entry '" + tensor + "' is not a file name");
      const auto s = shard.get<std::string>();
      if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..") {
        throw Error(index_path.string() + ": weight_map entry '" + tensor + "' names '" + s + "', not a file in the directory");
      }
      weight_map[tensor] = s;
      shards.insert(s);
    }
    for (const auto& s : shards) c.paths_.push_back(dir / s);
  } else if (std::filesystem::is_regular_file(dir / "model.safetensors")) {
    c.paths_.push_back(dir / "model.safetensors");
  } else {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.is_regular_file() && e.path().extension() == ".safetensors") c.paths_.push_back(e.path());
    }
    std::sort(c.paths_.begin(), c.paths_.end());
    if (c.paths_.empty()) throw Error(dir.string() + " has no *.safetensors file");
  }
  for (const auto& p : c.paths_) {
    if (!std::filesystem::is_regular_file(p)) throw Error("shard " + p.string() + " named by " + index_path.string() + " is missing");
    c.files_.push_back(File::open(p));
    c.bytes_ += std::filesystem::file_size(p);
  }
  for (size_t i = 0; i < c.files_.size(); ++i) {
    for (const auto& t : c.files_[i].tensors()) {
      if (!weight_map.empty()) {
        const auto it = weight_map.find(t.name);
        if (it == weight_map.end() || c.dir_ / it->second != c.paths_[i]) continue;  // not the index's copy
      }
      if (!c.index_.emplace(t.name, std::make_pair(i, &t)).second) {
        throw Error("tensor '" + t.name + "' is in two files of " + dir.string());
      }
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    if (c.index_.find(tensor) == c.index_.end()) {
      throw Error(index_path.string() + " lists tensor '" + tensor + "' in " + shard + ", which does not hold it");
    }
  }
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : index_) out.push_back(name);
  return out;
}

bool Checkpoint::has(std::string_view name) const { return index_.find(name) != index_.end(); }

const TensorInfo& Checkpoint::info(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw Error(dir_.string() + ": checkpoint has no tensor '" + std::string(name) + "'");
  return *it->second.second;
}

std::span<const std::byte> Checkpoint::data(std::string_view name) const {
  const auto& t = info(name);
  return files_[index_.find(name)->second.first].data(t);
}

void Checkpoint::release(std::string_view name) const {
  const auto& t = info(name);
  files_[index_.find(name)->second.first].release(t);
}

}  // namespace kestrel::safetensors
