// The rows of a speculative verification step: a chunk of k + 1 < 8 tokens fed at once must give
// each row the hidden state that decoding those tokens one at a time gives, bit for bit, and
// rolling the cache back to any row and going on must equal never having fed the rest. This is
// what makes greedy speculative decoding return exactly the non-speculative tokens (and sampled
// decoding the same tokens for the same seed). Gemma 4 tiny models (window 8: the chunk and the
// rollback cross the ring) and the default Gemma 3 270M, source and W4A16 weights (the W4A16
// decode kernels with bf16 and with int8 activations).
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "kestrel/formats/gguf.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/model/model.h"
#include "kestrel/runtime/model_path.h"
#include "test_models.h"

namespace kestrel::model {
namespace {

namespace fs = std::filesystem;

void check_rows(const fs::path& path, Precision precision, size_t history_length, const std::string& what,
                kernels::DecodeActivations decode = kernels::DecodeActivations::kAuto) {
  SCOPED_TRACE(what);
  const gguf::File file = gguf::File::open(path);
  ThreadPool pool(2);
  LoadOptions options;
  options.precision = precision;
  options.decode_activations = decode;
  const auto model = load_model(file, options, pool);
  const size_t d = model->info().d_model, n_vocab = model->info().n_vocab;
  const auto history = random_tokens(history_length, n_vocab, 7);
  const auto chunk = random_tokens(kernels::kTileMinTokens - 1, n_vocab, 8);
  std::vector<float> scratch(history_length * d);

  // One token at a time.
  KvCache fed = model->new_cache(256);  // the history, prefilled once; each case takes a copy
  model->forward_hidden(history, fed, Logits::kLast, scratch.data(), pool);
  KvCache one = fed;
  std::vector<float> decoded(chunk.size() * d);
  for (size_t t = 0; t < chunk.size(); ++t) {
    model->forward_hidden({&chunk[t], 1}, one, Logits::kLast, &decoded[t * d], pool);
  }
  for (size_t n = 2; n <= chunk.size(); ++n) {
    KvCache many = fed;
    std::vector<float> rows(n * d);
    model->forward_hidden({chunk.data(), n}, many, Logits::kAll, rows.data(), pool);
    for (size_t i = 0; i < n * d; ++i) ASSERT_EQ(rows[i], decoded[i]) << n << " rows, row " << i / d;
    // Roll back to keep the first `keep` rows, feed the next token: as if only those were fed.
    for (size_t keep = 1; keep < n; ++keep) {
      KvCache rolled = many;
      ASSERT_EQ(rolled.truncate(history_length + keep), history_length + keep);
      std::vector<float> next(d);
      model->forward_hidden({&chunk[keep], 1}, rolled, Logits::kLast, next.data(), pool);
      for (size_t i = 0; i < d; ++i) ASSERT_EQ(next[i], decoded[keep * d + i]) << n << " rows, kept " << keep;
    }
  }
}

TEST(VerifyRows, EqualDecodeStepsGemma4Tiny) {
  for (const char* name : {"e2b_tiny", "e4b_tiny"}) {
    check_rows(tiny_gemma4(name), Precision::kSource, 20, std::string(name) + " source");
    check_rows(tiny_gemma4(name), Precision::kBF16, 20, std::string(name) + " bf16");
  }
}

TEST(VerifyRows, EqualDecodeStepsGemma3) {
  KESTREL_DEFAULT_MODEL_OR_SKIP(path)
  check_rows(path, Precision::kW4A16, 40, "gemma3 w4a16, bf16 decode activations", kernels::DecodeActivations::kBf16);
  check_rows(path, Precision::kW4A16, 40, "gemma3 w4a16, int8 decode activations", kernels::DecodeActivations::kInt8);
  check_rows(path, Precision::kSource, 40, "gemma3 source");
  // The GGUF as -m loads it (INT4 + Q8_0 layers; Q8_0 products on gemv_q8_interleaved with int8).
  check_rows(path, Precision::kAuto, 40, "gemma3 auto form, bf16 activations", kernels::DecodeActivations::kBf16);
  check_rows(path, Precision::kAuto, 40, "gemma3 auto form, int8 activations", kernels::DecodeActivations::kInt8);
}

}  // namespace
}  // namespace kestrel::model
