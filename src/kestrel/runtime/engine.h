// The engine: a loaded model, its tokenizer, a KV cache and a thread pool, generating text.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/head/flashhead.h"
#include "kestrel/model/model.h"
#include "kestrel/model/mtp_assistant.h"
#include "kestrel/runtime/generate_options.h"
#include "kestrel/runtime/grammar.h"
#include "kestrel/runtime/sampler.h"
#include "kestrel/runtime/session.h"
#include "kestrel/text/tokenizer.h"

namespace kestrel::runtime {

/// Which output head produces next-token scores in generate() / step().
enum class HeadMode {
  kAuto,   // FlashHead when the image has it, else the dense head
  kDense,  // always the dense head
  kFlash,  // FlashHead (kestrel::Error if the image has none)
};

/// Options that do not fit the model (`--probes` past its FlashHead clusters or without a
/// FlashHead, `--head flash` on a model without one, a context past its maximum): the user's
/// choice, not a damaged file, so the CLI neither falls back to another model for it nor
/// reports a broken image (a usage error, status 2).
class OptionMismatch : public Error {
 public:
  using Error::Error;
};

/// A draft model whose vocabulary is not the target's (Engine::load_draft_model): the --draft
/// option does not fit the model.
class VocabularyMismatch : public OptionMismatch {
 public:
  using OptionMismatch::OptionMismatch;
};

/// Throws VocabularyMismatch unless `draft` has `target`'s vocabulary: the same number of
/// tokens (tokenizer and output head) and the same piece at every id. `draft_name` names the
/// draft model in the message.
void check_same_vocabulary(const text::Tokenizer& target, size_t target_n_vocab, const text::Tokenizer& draft,
                           size_t draft_n_vocab, const std::string& draft_name);

/// The check `kestrel serve` makes before it binds its port (the models load afterwards):
/// throws VocabularyMismatch, its message naming --draft, unless the draft model file at
/// `draft_path` has the tokenizer vocabulary (tokenizer.ggml.tokens) and embedding rows of the
/// model file at `target_path`. Reads metadata only (no weights load). Throws kestrel::Error,
/// naming --draft, when the draft file does not open as GGUF; a target file that does not open
/// passes (its load reports it), and Engine::load_draft_model checks everything again.
void check_draft_vocabulary(const std::filesystem::path& target_path, const std::filesystem::path& draft_path);

struct EngineOptions {
  int n_threads = 0;     // 0: every hardware thread
  /// Context positions. Unset: 4096, or the model's maximum when that is smaller;
  /// 0: the model's maximum; else exactly this (kestrel::Error above the maximum).
  std::optional<size_t> n_ctx;
  model::LoadOptions load;  // precision of the layer matrices
  HeadMode head = HeadMode::kAuto;
  size_t probes = 0;        // FlashHead clusters probed per step; 0: the image's default
  /// FlashHead's greedy proof (head::FlashHead::proves; `--flashhead-proof on`) where the image
  /// has its data; off (the default): the fixed probes alone.
  bool flashhead_proof = false;
};

/// The shared model: weights, tokenizer, output heads and the thread pool. Sequences are
/// Sessions (session.h) on it; eval / step / generate / cache here use the default Session,
/// allocated with the engine, for callers that run one sequence at a time.
class Engine {
 public:
  /// Maps and loads the model. Throws kestrel::Error (gguf::GgufError for a bad file).
  Engine(const std::filesystem::path& model_path, const EngineOptions& options);
  /// As above, computing on `shared_pool` (options.n_threads is ignored) instead of a pool of
  /// its own: a draft model and its target take turns on one set of threads, so that neither's
  /// idle workers spin while the other computes. `shared_pool` must outlive the Engine.
  Engine(const std::filesystem::path& model_path, const EngineOptions& options, ThreadPool& shared_pool);
  ~Engine();
  Engine(const Engine&) = delete;  // Sessions refer to it: it stays where it was made
  Engine& operator=(const Engine&) = delete;

  const text::Tokenizer& tokenizer() const { return tokenizer_; }
  const model::Model& model() const { return *model_; }
  ThreadPool& pool() { return *pool_; }
  /// Context positions of every Session's KV cache.
  size_t n_ctx() const { return n_ctx_; }
  /// True when the file carries tokenizer.chat_template (an instruction-tuned model).
  bool has_chat_template() const { return file_.has("tokenizer.chat_template"); }
  /// Tokens that end a turn: EOS and <end_of_turn> when the vocabulary has them.
  const std::vector<TokenId>& stop_tokens() const { return stop_tokens_; }

  /// Text to tokens (BOS added when the model wants it; control tokens parsed when `special`).
  std::vector<TokenId> encode(std::string_view text, bool special) const;

  /// The image's Gemma 4 MTP assistant (docs/speculative.md), which `--draft auto` drafts
  /// with, or null when the image has none.
  const model::MtpAssistant* mtp_assistant() const { return mtp_.get(); }
  /// A text naming what decides the bits of this engine's keys and values: the model file (path,
  /// size, modification time), the load options, the kernel switches of the environment, the CPU's
  /// flags and Kestrel's version. Two engines with the same identity write the same KV cache for
  /// the same tokens (the prefix cache's files are keyed by it).
  const std::string& kv_identity() const { return kv_identity_; }
  /// The FlashHead in use, or null when the dense head scores tokens.
  const head::FlashHead* flashhead() const { return flash_.get(); }
  size_t probes() const { return probes_; }
  /// Bytes one decode step (one token, no draft) reads from memory with `cache` at its n_past:
  /// the layers' weights (model::ModelInfo::decode_weight_bytes), the output head in use (the
  /// dense head's matrix, or FlashHead's search_bytes at probes()) and the KV cache's
  /// read_bytes(). Divided into the machine's read bandwidth it gives decode's upper limit in
  /// tokens/s (docs/benchmarks.md).
  size_t decode_read_bytes(const model::KvCache& cache) const;
  /// The bytes of decode_read_bytes that are one row's own when several sequences decode in one
  /// step (Scheduler: one pass over the layers for every row): its KV cache's read_bytes() and,
  /// with FlashHead, the head rows of its probed clusters (FlashHead::search_row_bytes); the
  /// layers, the centroids and a dense head are read once for all rows. A step of n rows at
  /// these positions reads at most decode_read_bytes + (n - 1) * decode_row_bytes, so on a
  /// read-bound CPU n streams give at most n * B1 / (B1 + (n - 1) * b) times one stream's
  /// tokens/s (`kestrel bench --concurrency`'s "read bound" column; docs/benchmarks.md).
  size_t decode_row_bytes(const model::KvCache& cache) const;
  /// Compiles grammars for this model's vocabulary and stop tokens (created on first use, then
  /// shared by every Session). Thread-safe.
  GrammarCompiler& grammars();

  /// Speculative decoding with a draft model (`--draft IMAGE`, DraftMode::kModel): loads the
  /// image or GGUF at `path` on this engine's thread pool, with this engine's context size
  /// (capped at the draft model's maximum), the head `options.head` asks for (FlashHead when the
  /// draft image has it, by default) and `options.load`'s precision. Each Session then drafts
  /// with a Session of its own on it (Session::draft_session). Throws VocabularyMismatch when
  /// its vocabulary is not this model's (ids must mean the same tokens), kestrel::Error when it
  /// does not load.
  void load_draft_model(const std::filesystem::path& path, const EngineOptions& options);
  /// The draft model, or null.
  Engine* draft_model() const { return draft_.get(); }

  /// The default Session and its operations; see Session.
  Session& session();
  const model::KvCache& cache() { return session().cache(); }
  void reset() { session().reset(); }
  std::span<float> eval(std::span<const TokenId> tokens) { return session().eval(tokens); }
  TokenScores step(std::span<const TokenId> tokens) { return session().step(tokens); }
  GenerateResult generate(std::span<const TokenId> prompt, const GenerateOptions& options,
                          const TextCallback& on_text = nullptr) {
    return session().generate(prompt, options, on_text);
  }

 private:
  Engine(const std::filesystem::path& model_path, const EngineOptions& options, ThreadPool* shared_pool);

  gguf::File file_;
  std::unique_ptr<ThreadPool> own_pool_;  // null when computing on a shared pool
  ThreadPool* pool_;
  std::unique_ptr<model::Model> model_;
  text::Tokenizer tokenizer_;
  size_t n_ctx_ = 0;
  std::string kv_identity_;
  std::unique_ptr<head::FlashHead> flash_;
  size_t probes_ = 0;
  std::unique_ptr<model::MtpAssistant> mtp_;
  std::vector<TokenId> stop_tokens_;
  std::unique_ptr<Engine> draft_;
  std::unique_ptr<Session> session_;
  std::once_flag grammars_once_;
  std::unique_ptr<GrammarCompiler> grammars_;
};

}  // namespace kestrel::runtime
