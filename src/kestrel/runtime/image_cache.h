// The GGUF image cache (issue 43): the first auto-precision run of a GGUF converts it once and
// writes its auto form as a Kestrel image (image/auto_image.h) into cache_dir()/images/; later
// runs map that image, which holds every matrix in the layout its kernels read, instead of
// converting the GGUF again (docs/quantization.md, "A GGUF as it loads").
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>


namespace kestrel::runtime {

/// Whether the cache is on, read here alone: off with `no_image_cache` (the commands'
/// --no-image-cache) or KESTREL_IMAGE_CACHE=0; on with KESTREL_IMAGE_CACHE unset, empty or 1.
/// Throws kestrel::Error for another value of the variable.
bool image_cache_enabled(bool no_image_cache);

/// The cache file of the GGUF `gguf`: cache_dir()/images/STEM.auto-KEY.kimg. KEY is 16 hex digits
/// of an XXH3-64 over the GGUF's size, modification time (ns) and sampled content (its first and
/// last MiB and 64 KiB at 64 evenly spaced offsets, read with pread: the file's pages are not
/// mapped) and the versions of what writes the image (image::kFormatVersion, the int8 layouts',
/// image::kAutoImageVersion, KESTREL_VERSION): another or a modified GGUF, or another converter,
/// never names an earlier file. Throws kestrel::Error when the GGUF cannot be read.
std::filesystem::path image_cache_path(const std::filesystem::path& gguf);

/// What a load found in the cache: "hit", "written" or "off" (image_cache_status_name).
enum class ImageCacheStatus { kOff, kHit, kWritten };
const char* image_cache_status_name(ImageCacheStatus s);

struct CachedImage {
  ImageCacheStatus status = ImageCacheStatus::kOff;
  std::filesystem::path path;  // the file to load: the cached image (kHit, kWritten), else the GGUF
  uint64_t bytes = 0;          // the image's size (kHit, kWritten)
  double seconds = 0;          // kWritten: the conversion and write, wall time
};

/// The cached image of the GGUF `gguf`: kHit where image_cache_path(gguf) exists (whether it
/// loads is the load's to find: a caller whose load of it fails warns and calls again with
/// `rebuild`), else kWritten after writing it (image::build_auto_image on `n_threads` threads, 0: every core; to a name of
/// this process's own, renamed into place: two processes at once each write a whole file and the
/// last rename wins; `rebuild`: write even where the file exists). kOff, with `path` = `gguf`,
/// where the file is a Kestrel image already or not a model this Kestrel runs (model::GemmaConfig
/// refuses its metadata: the load says why), its auto form cannot be cached
/// (image::NotCacheable), or the cache folder cannot be written (then `warn` gets one line saying
/// why, and the caller runs the GGUF). Throws kestrel::Error only for a GGUF that cannot be read.
CachedImage cached_image(const std::filesystem::path& gguf, int n_threads,
                         const std::function<void(const std::string&)>& warn, bool rebuild = false);

}  // namespace kestrel::runtime
