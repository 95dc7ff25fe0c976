// libFuzzer target: safetensors parsing (formats/safetensors.h) and every tensor's data.
//
// The contract under test: no input makes the reader crash, read out of bounds or allocate
// without bound; bad input raises kestrel::Error. Any other exception escapes and aborts the
// run, which libFuzzer reports as a crash; ASan/UBSan/LeakSanitizer reports are findings too.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/formats/safetensors.h"

namespace {

volatile uint64_t g_sink = 0;
void sink(uint64_t v) { g_sink = g_sink + v; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto file = kestrel::safetensors::File::parse(bytes, "fuzz.safetensors");
    for (const auto& [k, v] : file.metadata()) sink(k.size() + v.size());
    for (const auto& t : file.tensors()) {
      sink(file.find(t.name) != nullptr);
      sink(t.n_elements() * kestrel::safetensors::dtype_size(t.dtype));
      const auto d = file.data(t);
      if (d.size() != t.n_bytes() || d.data() < bytes.data() || d.data() + d.size() > bytes.data() + bytes.size()) {
        __builtin_trap();  // the parser promised the tensor lies inside the file
      }
      uint64_t x = 0;
      for (std::byte b : d) x += static_cast<uint8_t>(b);  // touch every byte (ASan checks the bounds)
      sink(x);
      file.release(t);  // a no-op for parse(), which maps nothing
    }
    sink(file.find("no.such.tensor") != nullptr);
  } catch (const kestrel::Error&) {
    // Rejected input: the expected outcome for most mutations.
  }
  return 0;
}
