// The HTTP application behind `kestrel serve` (internal to src/kestrel/server): routes,
// admission of generation requests, and running them on the engine.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/scheduler.h"
#include "kestrel/server/access_log.h"
#include "kestrel/server/api_error.h"
#include "kestrel/server/chat_prompt.h"
#include "kestrel/server/messages_request.h"
#include "kestrel/server/metrics.h"
#include "kestrel/server/openai_format.h"
#include "kestrel/server/responses_request.h"
#include "kestrel/server/request.h"
#include "kestrel/server/server.h"

namespace kestrel::server {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using runtime::TokenId;

/// Seconds since t0.
double seconds_since(Clock::time_point t0);
/// Unix time in seconds (the `created` field).
int64_t unix_now();
/// prefix + 24 random hex digits ("chatcmpl-…", "call_…").
std::string random_id(const char* prefix);
/// Sets status and a JSON body (invalid UTF-8 replaced).
void send_json(httplib::Response& res, int status, const nlohmann::json& body);

/// The wire format of a generation route: OpenAI's chat completions / completions, OpenAI's
/// Responses API, or Anthropic's Messages API (the last two run as chat requests).
enum class Wire { kOpenAI, kResponses, kMessages };

/// One admitted generation: everything the content provider needs once it owns the engine.
struct Job {
  Endpoint endpoint = Endpoint::kChat;
  Wire wire = Wire::kOpenAI;
  std::shared_ptr<ResponsesRequest> responses;  // Wire::kResponses
  std::shared_ptr<MessagesRequest> messages;    // Wire::kMessages
  bool stream = false;
  bool include_usage = false;
  int top_logprobs = -1;
  size_t n = 1;                         // choices per prompt
  size_t best_of = 1;                   // samples per prompt (>= n); the n of highest logprob are returned
  bool user_logprobs = true;            // the client asked for logprobs (best_of collects them anyway)
  bool echo = false;                    // completions: the prompt text (and its logprobs) first
  int prompt_logprobs = -1;             // completions: vLLM's prompt_logprobs
  std::vector<std::vector<TokenId>> prompts;
  std::vector<std::string> prompt_texts;  // per prompt, the text echo returns
  runtime::GenerateOptions options;
  ChatPrompt chat;  // chat only
  ResponseMeta meta;
  Clock::time_point arrival;
  std::shared_ptr<void> admission;  // holds a place among options.max_queue until the job ends
};

class App {
 public:
  /// Throws kestrel::Error for an empty options.draft, an unknown options.draft_accept,
  /// options.log_format or options.pooling.
  explicit App(const ServerOptions& options)
      : options_(options),
        log_format_(parse_log_format(options.log_format)),
        draft_mode_(runtime::parse_draft_mode(options.draft)),
        draft_accept_(runtime::parse_draft_accept(options.draft_accept)),
        pooling_(runtime::parse_pooling(options.pooling)) {
    if (pooling_ == runtime::Pooling::kNone) throw Error("--pooling none: /v1/embeddings needs mean, last or cls");
  }

  void install_routes();
  /// GET / (the chat page), /metrics/live (live metrics) and /ui/FILE (their static files).
  void install_webui_routes();
  httplib::Server& http() { return http_; }
  /// Shutting down: running generations stop at their next token.
  void stop_generating() { stopping_ = true; }
  /// Takes the loaded engine and starts the scheduler with its sessions (kestrel::Error when
  /// they do not fit in memory).
  void set_engine(std::unique_ptr<runtime::Engine> engine) {
    engine_ = std::move(engine);
    runtime::SchedulerOptions so;
    so.n_sessions = options_.parallel;
    so.prefill_chunk = options_.prefill_chunk;
    so.cache_ram = options_.cache_ram_mib << 20;
    so.cache_dir = options_.cache_dir;
    scheduler_ = std::make_unique<runtime::Scheduler>(
        *engine_, so, [this](size_t waiting, size_t running) { metrics_.load(waiting, running); });
    metrics_.sessions(scheduler_->n_sessions(), scheduler_->kv_bytes());
    metrics_.prefix_cache(scheduler_->prefix_cache_stats(), so.cache_ram);
    metrics_.flashhead(engine_->flashhead(), engine_->probes());
    chat_template_ = detect_chat_template(engine_->tokenizer());
    ready_ = true;
  }
  /// A line for the log: the chat format chosen and whether the model is instruction-tuned.
  std::string chat_format_note() const {
    const char* name = chat_template_ == ChatTemplate::kGemma4 ? "Gemma 4" : "Gemma 3";
    return std::string("chat format ") + name +
           (engine_->has_chat_template() ? "" : " (the model has no chat template: a base model)");
  }

 private:
  // Runs `body`, turning ApiError and any other exception into error responses: OpenAI's shape,
  // or Anthropic's for Wire::kMessages.
  void guarded(const char* endpoint, httplib::Response& res, const std::function<void()>& body,
               Wire wire = Wire::kOpenAI);
  /// The body parsed with its keys in the client's order (the Responses and Messages
  /// translations keep schemas in order); 400 as parse_body.
  nlohmann::ordered_json parse_ordered_body(const std::string& body) const;
  void check_ready() const {
    if (!ready_) throw ApiError(503, "the model is still loading", "", "model_loading", "server_error");
  }
  void check_auth(const httplib::Request& req) const;
  /// The served model as /v1/models lists it (OpenAI's model object).
  json model_object() const;
  /// Throws ApiError 404 model_not_found unless `name` is the served model's id or its alias.
  void check_model_name(const std::string& name) const;
  json parse_body(const std::string& body) const;
  // A POST route that reads its body itself, as JSON whatever the Content-Type (app.cpp says why).
  using PostHandler = std::function<void(const httplib::Request&, httplib::Response&, const std::string& body)>;
  void post(const std::string& pattern, PostHandler handler);
  /// GET /props: what the chat page shows about the server (model, context, FlashHead).
  json props() const;

  // A place among options.max_queue admitted requests, or ApiError 429 when none is left.
  std::shared_ptr<void> admit();
  // Runs one prompt through the scheduler; metrics of tokens and prompt-cache reuse.
  runtime::GenerateResult generate(const std::vector<TokenId>& prompt, const runtime::GenerateOptions& options,
                                   const runtime::TextCallback& on_text);
  void handle_generate(const httplib::Request& req, httplib::Response& res, const std::string& raw,
                       Endpoint endpoint, Wire wire = Wire::kOpenAI);
  /// Runs a chat job's generation, handing each reply event (content, tool calls; reasoning is
  /// dropped) to on_event: as it comes when streaming, else once the reply is complete. The
  /// forced-call and parallel_tool_calls rules apply as in run_chat. A cancelled result is
  /// returned as it is.
  runtime::GenerateResult run_reply(Job& job, const std::function<bool(const std::string&)>& write,
                                    const std::function<void(const text::ReplyEvent&)>& on_event);
  void run_responses(Job& job, const std::function<bool(const std::string&)>& write);
  void run_messages(Job& job, const std::function<bool(const std::string&)>& write);
  /// The routes of the Responses and Messages APIs (wire_routes.cpp).
  void install_wire_routes();
  /// POST /v1/embeddings (embeddings_routes.cpp): each input a prefill on the scheduler whose
  /// final hidden states are pooled (options.pooling); 501 unless options.embeddings.
  void install_embeddings_routes();
  void run_job(Job& job, httplib::DataSink& sink);
  void run_chat(Job& job, const std::function<bool(const std::string&)>& write);
  /// Non-streamed n / best_of / several prompts: every (prompt, sample) runs as its own request
  /// on the scheduler at once (so they decode as one batch), sample k with seed + k; the calling
  /// thread writes heartbeats meanwhile and cancels them all when the client goes away.
  /// results[prompt][sample]; empty when cancelled.
  std::vector<std::vector<runtime::GenerateResult>> generate_samples(Job& job,
                                                                     const std::function<bool(const std::string&)>& write);
  /// Metrics and the access log's counts for a finished generation.
  void account(const runtime::GenerateResult& result);
  /// The chat choice (a whole message) of one result.
  json chat_choice(const Job& job, const runtime::GenerateResult& result, size_t index);
  void run_completion(Job& job, const std::function<bool(const std::string&)>& write);
  /// After a cancelled generation: throws kestrel::Error when the server is stopping.
  void cut_short() const;
  // Sets o.on_token (TTFT/ITL metrics, a heartbeat write when a token produced no output, and
  // logprobs collection for streaming) and o.on_wait (a heartbeat while no token comes), so
  // that a closed connection is noticed whatever the request is doing.
  void watch_connection(Job& job, runtime::GenerateOptions& o, const std::function<bool(const std::string&)>& write,
                        bool& wrote, std::vector<runtime::StepLogprobs>& pending);

  ServerOptions options_;
  LogFormat log_format_;
  runtime::DraftMode draft_mode_;
  runtime::DraftAccept draft_accept_;
  runtime::Pooling pooling_;
  httplib::Server http_;
  std::unique_ptr<runtime::Engine> engine_;
  std::unique_ptr<runtime::Scheduler> scheduler_;  // after engine_: stopped before it goes
  std::atomic<size_t> admitted_{0};
  ChatTemplate chat_template_ = ChatTemplate::kGemma3;
  std::atomic<bool> ready_{false};
  std::atomic<bool> stopping_{false};
  Metrics metrics_;
  ResponseStore responses_{options_.responses_store};
};

}  // namespace kestrel::server
