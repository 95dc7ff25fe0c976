// The engine: a loaded model, its tokenizer, a KV cache and a thread pool, generating text.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/model/model.h"
#include "kestrel/runtime/sampler.h"
#include "kestrel/text/tokenizer.h"

namespace kestrel::runtime {

struct EngineOptions {
  int n_threads = 0;     // 0: every hardware thread
  /// Context positions. Unset: 4096, or the model's maximum when that is smaller;
  /// 0: the model's maximum; else exactly this (kestrel::Error above the maximum).
  std::optional<size_t> n_ctx;
  model::LoadOptions load;  // precision of the layer matrices
};

struct GenerateOptions {
  size_t max_tokens = 256;
  SamplerConfig sampler;
  bool ignore_eos = false;         // keep going past EOS / <end_of_turn>
  std::vector<std::string> stop;   // stop strings; the text ends before the first match
  /// Called right after each token is chosen, before it is turned into text (benchmark timing).
  std::function<void(TokenId)> on_token;
};

struct GenerateResult {
  std::vector<TokenId> tokens;     // generated ids (a final stop token included)
  std::string text;                // decoded text, cut before a stop string
  std::string finish_reason;       // "stop" (stop token or string) or "length"
  size_t prompt_tokens = 0;
  double ttft_ms = 0;              // prompt start to first token sampled
  double prefill_tok_s = 0;        // prompt_tokens / ttft
  double decode_tok_s = 0;         // (generated - 1) / time after the first token
};

/// Called with each piece of text as soon as it is final; return false to stop generating.
using TextCallback = std::function<bool(std::string_view)>;

class Engine {
 public:
  /// Maps and loads the model. Throws kestrel::Error (gguf::GgufError for a bad file).
  Engine(const std::filesystem::path& model_path, const EngineOptions& options);

  const text::Tokenizer& tokenizer() const { return tokenizer_; }
  const model::Model& model() const { return *model_; }
  const model::KvCache& cache() const { return cache_; }
  ThreadPool& pool() { return pool_; }
  size_t n_ctx() const { return cache_.n_ctx; }
  /// True when the file carries tokenizer.chat_template (an instruction-tuned model).
  bool has_chat_template() const { return file_.has("tokenizer.chat_template"); }
  /// Tokens that end a turn: EOS and <end_of_turn> when the vocabulary has them.
  const std::vector<TokenId>& stop_tokens() const { return stop_tokens_; }

  /// Text to tokens (BOS added when the model wants it; control tokens parsed when `special`).
  std::vector<TokenId> encode(std::string_view text, bool special) const;

  /// Starts a new sequence (empties the KV cache).
  void reset() { cache_.clear(); }
  /// Appends `tokens` to the sequence and returns the logits of the last one ([n_vocab]).
  /// Throws kestrel::Error if they do not fit in the context.
  std::span<float> eval(std::span<const TokenId> tokens);

  /// Runs the prompt in a fresh sequence, then samples up to max_tokens tokens.
  /// Throws kestrel::Error if the prompt is empty or longer than the context.
  GenerateResult generate(std::span<const TokenId> prompt, const GenerateOptions& options,
                          const TextCallback& on_text = nullptr);

 private:
  gguf::File file_;
  ThreadPool pool_;
  std::unique_ptr<model::Model> model_;
  text::Tokenizer tokenizer_;
  model::KvCache cache_;
  std::vector<float> logits_;
  std::vector<TokenId> stop_tokens_;
};

}  // namespace kestrel::runtime
