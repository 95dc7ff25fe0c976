// A GGUF's auto form (quant/gguf_convert.h: what `--precision auto` converts at load) written as
// a Kestrel image whose tensors are already in the layouts the int8 kernels read, so that loading
// it copies (almost) nothing: the GGUF image cache's file (runtime/image_cache.h).
//
// What each tensor becomes (docs/image-format.md, "The GGUF image cache"):
//   layer matrices   Q4_0/Q4_1/Q4_K: INT4 with the file's own codes (quant::w4_from_gguf), in the
//                    int8 layout (NAME.q4i8*) where its rows are a multiple of 16, else plain
//                    (NAME.q4, .scales, .mins); Q8_0, and every other quantized type as
//                    quant::q8_0_from_gguf converts it: the Q8_0 int8 layout (NAME.q8i*,
//                    image/q8_tensors.h); BF16 as stored.
//   other matrices   (the token embedding / tied output head, Gemma 4's per-layer tables): the
//                    auto form's rows, as stored (Q8_0, BF16, F16, F32), Q8_0 converted, or INT4
//                    plain; the output head's Q8_0 rows also in the Q8_0 int8 layout
//                    (NAME.q8i*), which its int8 kernel reads in place.
//   vectors          F32, as the load widens them.
// So a model run from the image computes what the GGUF's auto form computes, bit for bit: the
// same numbers, in the layouts the load would have copied them into.
#pragma once

#include <cstdint>
#include <filesystem>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/image/builder.h"

namespace kestrel::image {

/// Thrown by build_auto_image for a GGUF whose auto form an image cannot hold as the load runs it
/// (F16/F32 layer matrices, a Q4_K parameter past fp16's range, INT4 groups of both kinds,
/// symmetric Q4_0 and affine Q4_1/Q4_K, in one file, rows of a Q8_0 form not a multiple of 32):
/// such a GGUF runs as it loads, uncached. The message says which tensor.
class NotCacheable : public Error {
 public:
  using Error::Error;
};

/// keys::kQuantMethod of an auto image.
inline constexpr const char* kAutoQuantMethod = "gguf-auto";
/// The converter's version (keys::kAutoVersion): bumped whenever build_auto_image writes other
/// tensors or bits for the same GGUF, so that the cache never maps an image an older one wrote.
inline constexpr uint32_t kAutoImageVersion = 1;

/// Writes the auto image of the GGUF `source` to `out` (through `out`.partial, renamed when
/// complete; no partial file is left on error), one tensor in memory at a time, each source
/// tensor's pages dropped once written. Throws NotCacheable (above), gguf::GgufError for a bad
/// source, kestrel::Error when `source` is already an image or a write fails.
BuildReport build_auto_image(const std::filesystem::path& source, const std::filesystem::path& out, ThreadPool& pool);

}  // namespace kestrel::image
