// libFuzzer target: GGUF parsing, every metadata getter, tensor data and dequantization.
//
// The contract under test (gguf.h): no input makes the reader crash, read out of bounds or
// allocate without bound; bad input raises kestrel::Error (GgufError). Any other exception
// type escapes LLVMFuzzerTestOneInput and aborts the run, which libFuzzer reports as a crash;
// ASan/UBSan/LeakSanitizer reports are findings as well.
//
// When the file carries tokenizer metadata, Tokenizer::from_gguf is exercised too, since it is
// the first consumer of untrusted metadata.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/text/tokenizer.h"

namespace {

using kestrel::gguf::File;
using kestrel::gguf::TensorInfo;

constexpr uint64_t kMaxDequantElements = 4096;

// Runs `f`, ignoring kestrel::Error (the documented way to reject input). Anything else escapes.
template <typename F>
void allow_error(F&& f) {
  try {
    f();
  } catch (const kestrel::Error&) {
  }
}

// Keeps results observable so the calls are not optimised away.
volatile uint64_t g_sink = 0;
void sink(uint64_t v) { g_sink = g_sink + v; }

void exercise_key(const File& file, const std::string& key) {
  sink(file.has(key));
  if (const auto* value = file.find(key)) sink(static_cast<uint64_t>(value->type));
  allow_error([&] { sink(file.get_uint(key)); });
  allow_error([&] { sink(static_cast<uint64_t>(file.get_int(key))); });
  allow_error([&] { sink(file.get_float(key) != 0.0); });
  allow_error([&] { sink(file.get_bool(key)); });
  allow_error([&] { sink(file.get_string(key).size()); });
  allow_error([&] {
    const auto& array = file.get_array(key);
    sink(array.size() + static_cast<uint64_t>(array.element_type));
  });
  allow_error([&] { sink(file.find_uint(key).value_or(0)); });
  allow_error([&] { sink(file.find_float(key).value_or(0.0) != 0.0); });
  allow_error([&] { sink(file.find_bool(key).value_or(false)); });
  allow_error([&] { sink(file.find_string(key).value_or("").size()); });
  allow_error([&] { sink(file.get_string_array(key).size()); });
  allow_error([&] { sink(file.get_float_array(key).size()); });
  allow_error([&] { sink(file.get_int_array(key).size()); });
}

void exercise_tensor(const File& file, const TensorInfo& info) {
  sink(file.find_tensor(info.name) != nullptr);
  allow_error([&] { sink(file.tensor(info.name).n_bytes); });
  sink(info.rows());
  sink(std::string_view(kestrel::gguf::tensor_type_name(info.type)).size());
  std::span<const std::byte> data;
  allow_error([&] { data = file.tensor_data(info); });
  if (data.size() != info.n_bytes) return;  // tensor_data threw (it must not, after parse)
  if (!kestrel::gguf::is_supported(info.type)) return;
  allow_error([&] {
    const uint64_t block = kestrel::gguf::block_elements(info.type);
    uint64_t n = std::min<uint64_t>(info.shape.at(0), kMaxDequantElements);
    n -= n % block;
    if (n == 0) return;
    const uint64_t bytes = kestrel::gguf::row_bytes(info.type, n);
    if (bytes > data.size()) __builtin_trap();  // parse promised a whole first row
    std::vector<float> row(n);
    kestrel::gguf::dequantize(info.type, data.data(), row.data(), n);
    for (float x : row) sink(x == x);
  });
}

void exercise_tokenizer(const File& file) {
  if (!file.has("tokenizer.ggml.model")) return;
  allow_error([&] {
    const auto tok = kestrel::text::Tokenizer::from_gguf(file);
    static constexpr std::string_view kText = "Hello world <start_of_turn>user\n\n\xc3\xa9\xff";
    for (int flags = 0; flags < 4; ++flags) {
      allow_error([&] {
        const auto ids = tok.encode(kText, flags & 1, flags & 2);
        sink(tok.decode(ids, flags & 1).size());
      });
    }
    // Every piece of the (bounded) vocabulary, rendered both ways.
    const size_t n = std::min<size_t>(tok.n_vocab(), 1 << 16);
    for (size_t id = 0; id < n; ++id) {
      const auto token = static_cast<kestrel::text::TokenId>(id);
      sink(static_cast<uint64_t>(tok.type(token)) + tok.piece(token).size());
      allow_error([&] { sink(tok.token_to_piece(token, false).size()); });
      allow_error([&] { sink(tok.token_to_piece(token, true).size()); });
    }
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const File file = File::parse(bytes);
    sink(file.version() + file.alignment() + file.file_size() + file.path().native().size());
    for (const auto& [key, value] : file.metadata()) {
      exercise_key(file, key);
    }
    exercise_key(file, "no.such.key");
    for (const TensorInfo& info : file.tensors()) exercise_tensor(file, info);
    allow_error([&] { sink(file.tensor("no.such.tensor").n_bytes); });
    exercise_tokenizer(file);
  } catch (const kestrel::Error&) {
    // Rejected input: the expected outcome for most mutations.
  }
  return 0;
}
