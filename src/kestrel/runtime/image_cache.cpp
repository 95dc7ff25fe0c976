#include "kestrel/runtime/image_cache.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/image/auto_image.h"
#include "kestrel/image/image.h"
#include "kestrel/model/gemma_config.h"
#include "kestrel/runtime/model_path.h"

namespace kestrel::runtime {
namespace {

constexpr size_t kEdgeBytes = size_t{1} << 20;     // hashed at each end of the GGUF
constexpr size_t kSampleBytes = size_t{64} << 10;  // hashed at each of kSamples offsets
constexpr size_t kSamples = 64;

// XXH3-64 of the GGUF's sampled content (image_cache_path), read with pread.
uint64_t sampled_hash(const std::filesystem::path& path, uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot read " + path.string() + ": " + std::strerror(errno));
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(kEdgeBytes);
  const auto hash_range = [&](uint64_t offset, size_t n) {
    n = static_cast<size_t>(std::min<uint64_t>(n, size - std::min(offset, size)));
    const ssize_t got = n == 0 ? 0 : ::pread(fd, buffer.data(), n, static_cast<off_t>(offset));
    if (got < 0 || static_cast<size_t>(got) != n) return false;
    XXH3_64bits_update(state, buffer.data(), n);
    return true;
  };
  bool ok = hash_range(0, kEdgeBytes);
  for (size_t i = 0; ok && i < kSamples; ++i) ok = hash_range(size / kSamples * i, kSampleBytes);
  ok = ok && hash_range(size > kEdgeBytes ? size - kEdgeBytes : 0, kEdgeBytes);
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  ::close(fd);
  if (!ok) throw Error("cannot read " + path.string() + ": it changed or could not be read while hashed");
  return h;
}

// Whether `path` is a GGUF worth converting: not a Kestrel image already, and a model this
// Kestrel runs (model::GemmaConfig reads its metadata; another architecture's load says why not).
bool convertible(const std::filesystem::path& path) {
  const gguf::File file = gguf::File::open(path);
  if (image::read_image_info(file).has_value()) return false;
  try {
    model::GemmaConfig::from_gguf(file);
  } catch (const Error&) {
    return false;
  }
  return true;
}

// A name next to `final` that no other process writes: final.PID-RANDOM.tmp.
std::filesystem::path temporary_name(const std::filesystem::path& final_path) {
  std::random_device rd;
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), ".%ld-%08x.tmp", static_cast<long>(::getpid()), rd());
  std::filesystem::path p = final_path;
  p += suffix;
  return p;
}

// Temporary files next to `final_path` that writers killed before their rename left (older than
// an hour: a live writer renames its file within seconds).
void remove_stale_temporaries(const std::filesystem::path& final_path) {
  const std::string prefix = final_path.filename().string() + ".";
  const auto now = std::filesystem::file_time_type::clock::now();
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(final_path.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.find(".tmp") == std::string::npos) continue;
    std::error_code e_ec;
    const auto written = e.last_write_time(e_ec);
    if (!e_ec && now - written > std::chrono::hours(1)) std::filesystem::remove(e.path(), e_ec);
  }
}

}  // namespace

bool image_cache_enabled(bool no_image_cache) {
  const char* v = std::getenv("KESTREL_IMAGE_CACHE");
  bool on = true;
  if (v != nullptr && *v != '\0') {
    if (std::strcmp(v, "0") == 0) {
      on = false;
    } else if (std::strcmp(v, "1") != 0) {
      throw Error(std::string("KESTREL_IMAGE_CACHE must be 0 (no GGUF image cache) or 1, not '") + v + "'");
    }
  }
  return on && !no_image_cache;
}

std::filesystem::path image_cache_path(const std::filesystem::path& gguf) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(gguf, ec);
  if (ec) throw Error("cannot read " + gguf.string() + ": " + ec.message());
  const auto mtime = std::filesystem::last_write_time(gguf, ec);
  if (ec) throw Error("cannot read " + gguf.string() + ": " + ec.message());
  char fields[256];
  std::snprintf(fields, sizeof(fields), "size %" PRIu64 " mtime %lld content %016" PRIx64 " format %u %u %u %u %s",
                size, static_cast<long long>(mtime.time_since_epoch().count()), sampled_hash(gguf, size),
                image::kFormatVersion, image::kW4Int8LayoutVersion, image::kQ8Int8LayoutVersion,
                image::kAutoImageVersion, KESTREL_VERSION);
  char name[64];
  std::snprintf(name, sizeof(name), ".auto-%016" PRIx64 ".kimg", XXH3_64bits(fields, std::strlen(fields)));
  return cache_dir() / "images" / (gguf.stem().string() + name);
}

const char* image_cache_status_name(ImageCacheStatus s) {
  switch (s) {
    case ImageCacheStatus::kHit: return "hit";
    case ImageCacheStatus::kWritten: return "written";
    case ImageCacheStatus::kOff: return "off";
  }
  return "off";
}

CachedImage cached_image(const std::filesystem::path& gguf, int n_threads,
                         const std::function<void(const std::string&)>& warn, bool rebuild) {
  CachedImage c;
  c.path = gguf;
  const std::filesystem::path path = image_cache_path(gguf);
  std::error_code ec;
  if (!rebuild && std::filesystem::is_regular_file(path, ec)) {
    // Only a GGUF's auto form is ever written under this key: no need to open the GGUF.
    c.status = ImageCacheStatus::kHit;
    c.path = path;
    c.bytes = std::filesystem::file_size(path, ec);
    return c;
  }
  if (!convertible(gguf)) return c;  // an image runs as it is; the load says what is wrong with another file
  const std::filesystem::path tmp = temporary_name(path);
  try {
    std::filesystem::create_directories(path.parent_path());
    remove_stale_temporaries(path);
    ThreadPool pool(n_threads);
    const image::BuildReport r = image::build_auto_image(gguf, tmp, pool);
    std::filesystem::rename(tmp, path);
    c.status = ImageCacheStatus::kWritten;
    c.path = path;
    c.bytes = r.image_bytes;
    c.seconds = r.seconds;
  } catch (const image::NotCacheable&) {
    // Runs as it loads, uncached: nothing to say beyond what the load says.
  } catch (const std::exception& e) {  // kestrel::Error, std::filesystem::filesystem_error
    warn("cannot write the GGUF image cache in " + path.parent_path().string() + " (" + e.what() +
         "); running from the GGUF, converting it at load (--no-image-cache or KESTREL_IMAGE_CACHE=0 turns the "
         "cache off)");
  }
  std::filesystem::remove(tmp, ec);
  return c;
}

}  // namespace kestrel::runtime
