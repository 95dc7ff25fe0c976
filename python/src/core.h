// The Python package's C++ side (docs/python.md): a loaded model shared by its Sessions and
// streams, the lock that lets one generation at a time compute on it, and the requests the
// Python layer builds. Thin: everything a generation does is runtime::Session / Generation's.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/base/error.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/generate_options.h"
#include "kestrel/runtime/generation.h"
#include "kestrel/server/chat_prompt.h"

namespace kestrel::python {

using runtime::TokenId;

/// An argument out of range or of the wrong form (Python: kestrel.InvalidRequestError, a ValueError).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A prompt (with the tokens asked for) that does not fit the context
/// (Python: kestrel.ContextLengthError).
class ContextLengthExceeded : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

class TokenStream;

/// One model's turn-taking. Sessions of an Engine share its thread pool, so one generation at a
/// time computes; a stream holds the turn from its first token to its last. Unlike std::mutex,
/// any thread may release it (a stream advanced in one thread may be dropped in another), and it
/// knows its holder: a thread that asks for it while a stream it left open holds it ends that
/// stream (Ctrl-C out of a loop over a stream leaves one open) instead of waiting for itself.
class ModelLock {
 public:
  /// Waits for the turn; call without the GIL. `stream`: the stream that takes it (null: a
  /// whole generation).
  void acquire(TokenStream* stream);
  void release();
  /// The stream holding the turn, when the calling thread last advanced it; else null. Call
  /// with the GIL held (streams are only dropped with it held).
  TokenStream* stream_left_open_by_this_thread();
  /// A stream that holds the turn records the thread advancing it.
  void set_owner_thread();

 private:
  std::mutex mutex_;
  std::condition_variable free_;
  bool busy_ = false;
  std::thread::id owner_;
  TokenStream* stream_ = nullptr;
};

/// How to load a model (kestrel.Model's arguments).
struct LoadArgs {
  std::string model = "default";        // "default" or a path (GGUF or Kestrel image)
  std::optional<size_t> n_ctx;          // unset: 4096 or the model's maximum; 0: the maximum
  int threads = 0;                      // 0: every core
  std::string precision = "auto";       // auto, source, w4a16, bf16, fp16
  std::string head = "auto";            // auto, dense, flash
  size_t probes = 0;                    // FlashHead clusters per token; 0: the image's
  std::string decode_act = "auto";      // auto, bf16, int8
  std::optional<std::string> draft_model;  // a smaller model with the same vocabulary
  std::string cache_type_k = "f16";     // the KV cache's element types: f16, bf16, q8 (q8_0)
  std::string cache_type_v = "f16";
};

/// A loaded model: the Engine, its chat format and its turn.
struct Core {
  std::unique_ptr<runtime::Engine> engine;
  std::string path;       // the file loaded
  std::string warning;    // a note for the caller (the default image did not load), or empty
  server::ChatTemplate chat_template = server::ChatTemplate::kGemma3;
  ModelLock lock;
};

/// Loads the model as the CLI's -m does ("default": the cached default image when it exists
/// and the precision is auto, falling back to the default GGUF with a warning when it does not
/// load). Throws kestrel::Error (gguf::GgufError for a bad file, runtime::OptionMismatch for
/// options that do not fit the model). Call without the GIL.
std::shared_ptr<Core> load(const LoadArgs& args);

/// A sequence on a model: the Engine's default Session, or one of its own (kestrel.Session).
struct Sequence {
  std::shared_ptr<Core> core;
  std::unique_ptr<runtime::Session> own;  // null: the engine's default session
  runtime::Session& session() { return own ? *own : core->engine->session(); }
};

/// One generation, ready to run: its prompt and options, and for chat how the reply is parsed.
struct Request {
  std::vector<TokenId> prompt;
  runtime::GenerateOptions options;
  bool chat = false;
  server::ChatPrompt chat_prompt;  // chat only
};

/// Sampling and control arguments of kestrel.Model.generate (the CLI's meanings).
struct GenerateArgs {
  size_t max_tokens = 256;
  runtime::SamplerConfig sampler;
  std::optional<uint64_t> seed;  // unset: random
  std::vector<std::string> stop;
  bool ignore_eos = false;
  size_t min_tokens = 0;
  int logprobs = -1;  // -1: none; 0: the chosen token's; n: also the n most likely
  std::vector<std::pair<int64_t, float>> logit_bias;
  std::string draft = "auto";  // none, ngram, auto, model (the draft_model loaded with the Model)
  size_t draft_max = runtime::kMaxDraft;
  std::string draft_accept = "exact";
  std::optional<std::string> json_schema, grammar, regex;  // structured output, at most one
};

/// A plain-text or token-id generation. Throws InvalidArgument / ContextLengthExceeded /
/// runtime::InvalidGrammar for bad arguments.
Request make_request(Core& core, std::vector<TokenId> prompt, const GenerateArgs& args, bool cache_prompt);

/// A chat completion from an OpenAI request body (JSON text: messages, tools, tool_choice,
/// response_format, sampling fields), validated by the server's parser (server::ApiError names
/// the field). Draft settings as in GenerateArgs.
Request make_chat_request(Core& core, const std::string& body, const std::string& draft, size_t draft_max,
                          const std::string& draft_accept, bool cache_prompt);

/// The result of a generation as JSON: text, tokens, finish_reason, counts, timings, logprobs
/// (per token: id, token, logprob, top_logprobs), and for chat the OpenAI chat logprobs.
nlohmann::json result_json(const Core& core, const Request& request, const runtime::GenerateResult& result);

/// Runs a request to its end on `seq`, holding the model's turn (call without the GIL).
/// `keep_going`, when set, is asked after each token (the binding runs Python's signal
/// handlers there: Ctrl-C); false stops the generation (GenerateResult::cancelled).
runtime::GenerateResult run(Sequence& seq, const Request& request, const std::function<bool()>& keep_going);

/// Feeds one step of `g` to its session, as runtime::Session::generate's loop does.
void step(runtime::Generation& g, runtime::Session& session, size_t prompt_size);

}  // namespace kestrel::python
