#include "kestrel/server/server.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "kestrel/server/api_error.h"
#include "kestrel/server/chat_prompt.h"
#include "kestrel/server/fifo_lock.h"
#include "kestrel/server/metrics.h"
#include "kestrel/server/openai_format.h"
#include "kestrel/server/request.h"
#include "kestrel/text/reply_parser.h"

namespace kestrel::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using runtime::TokenId;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

// One admitted generation: everything the content provider needs once it owns the engine.
struct Job {
  Endpoint endpoint = Endpoint::kChat;
  bool stream = false;
  bool include_usage = false;
  int top_logprobs = -1;
  std::vector<std::vector<TokenId>> prompts;
  runtime::GenerateOptions options;
  ChatPrompt chat;  // chat only
  ResponseMeta meta;
  Clock::time_point arrival;
};

class App {
 public:
  explicit App(const ServerOptions& options) : options_(options) {}

  void install_routes();
  httplib::Server& http() { return http_; }
  /// Shutting down: running generations stop at their next token.
  void stop_generating() { stopping_ = true; }
  void set_engine(std::unique_ptr<runtime::Engine> engine) {
    engine_ = std::move(engine);
    chat_template_ = detect_chat_template(engine_->tokenizer());
    ready_ = true;
  }

 private:
  // Runs `body`, turning ApiError and any other exception into OpenAI error responses.
  void guarded(const char* endpoint, httplib::Response& res, const std::function<void()>& body);
  void check_ready() const {
    if (!ready_) throw ApiError(503, "the model is still loading", "", "model_loading", "server_error");
  }
  void check_auth(const httplib::Request& req) const;
  json parse_body(const httplib::Request& req) const;

  void handle_generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  void run_job(Job& job, httplib::DataSink& sink);
  void run_chat(Job& job, const std::function<bool(const std::string&)>& write);
  void run_completion(Job& job, const std::function<bool(const std::string&)>& write);
  // Token callback: TTFT/ITL metrics, a heartbeat write when a token produced no output
  // (so that a closed connection is noticed), and logprobs collection for streaming.
  runtime::TokenCallback token_callback(Job& job, const std::function<bool(const std::string&)>& write,
                                        bool& wrote, std::vector<runtime::StepLogprobs>& pending);

  ServerOptions options_;
  httplib::Server http_;
  std::unique_ptr<runtime::Engine> engine_;
  ChatTemplate chat_template_ = ChatTemplate::kGemma3;
  std::atomic<bool> ready_{false};
  std::atomic<bool> stopping_{false};
  FifoLock engine_lock_;
  Metrics metrics_;
};

void App::guarded(const char* endpoint, httplib::Response& res, const std::function<void()>& body) {
  try {
    body();
  } catch (const ApiError& e) {
    send_json(res, e.status(), e.body());
  } catch (const std::exception& e) {
    send_json(res, 500, ApiError::error_body(std::string("internal error: ") + e.what(), "server_error", "", ""));
  }
  metrics_.request(endpoint, res.status);
}

void App::check_auth(const httplib::Request& req) const {
  if (options_.api_key.empty()) return;
  const std::string header = req.get_header_value("Authorization");
  const std::string expected = "Bearer " + options_.api_key;
  // Constant-time comparison over the expected length.
  unsigned diff = header.size() != expected.size() ? 1u : 0u;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned>(static_cast<unsigned char>(expected[i]) ^
                                  static_cast<unsigned char>(i < header.size() ? header[i] : 0));
  }
  if (diff != 0) {
    throw ApiError(401, header.empty() ? "missing API key: send 'Authorization: Bearer KEY'" : "incorrect API key",
                   "", "invalid_api_key", "authentication_error");
  }
}

json App::parse_body(const httplib::Request& req) const {
  if (json_nesting_depth(req.body) > kMaxJsonDepth) {
    throw bad_request("the request body nests arrays/objects deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) throw bad_request("the request body is not valid JSON");
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  return body;
}

void App::install_routes() {
  http_.set_payload_max_length(options_.max_body_bytes);
  http_.new_task_queue = [n = options_.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
  // Errors raised by httplib itself (unknown path, body too large) get OpenAI's shape too.
  http_.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = "HTTP " + std::to_string(res.status);
    if (res.status == 404) message = "no such endpoint: " + req.method + " " + req.path;
    if (res.status == 413) {
      message = "the request body is larger than the limit of " + std::to_string(options_.max_body_bytes) + " bytes";
    }
    send_json(res, res.status, ApiError::error_body(message, ApiError::default_type(res.status), "", ""));
  });
  http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_json(res, 500, ApiError::error_body("internal error", "server_error", "", ""));
  });

  http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (ready_) {
      send_json(res, 200, {{"status", "ok"}});
    } else {
      send_json(res, 503, ApiError::error_body("the model is still loading", "server_error", "", "model_loading"));
    }
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(), "text/plain; version=0.0.4");
  });
  http_.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    guarded("models", res, [&] {
      check_auth(req);
      check_ready();
      json model = {{"id", options_.model_id},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "kestrel"},
                    {"max_model_len", engine_->n_ctx()}};
      send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
    });
  });
  http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, Endpoint::kChat);
  });
  http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, Endpoint::kCompletion);
  });
  http_.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded("tokenize", res, [&] {
      check_auth(req);
      check_ready();
      const json body = parse_body(req);
      std::vector<TokenId> tokens;
      if (body.contains("messages")) {
        GenerationRequest r = parse_chat_request(body);
        tokens = engine_->tokenizer().encode(build_chat_prompt(chat_template_, r).text, false, true);
      } else {
        auto text = body.find("content");
        if (text == body.end()) text = body.find("prompt");
        if (text == body.end() || !text->is_string()) {
          throw bad_request("'content' (or 'prompt') must be a string, or give 'messages'", "content");
        }
        auto flag = [&](const char* key) {
          auto a = body.find(key);
          if (a == body.end()) return true;
          if (!a->is_boolean()) throw bad_request(std::string("'") + key + "' must be a boolean", key);
          return a->get<bool>();
        };
        tokens = engine_->tokenizer().encode(text->get<std::string>(), flag("add_special"), flag("parse_special"));
      }
      json out = {{"tokens", tokens}, {"count", tokens.size()}, {"max_model_len", engine_->n_ctx()}};
      if (body.value("with_pieces", false) == true) {
        json pieces = json::array();
        for (TokenId t : tokens) pieces.push_back(engine_->tokenizer().token_to_piece(t, true));
        out["pieces"] = pieces;
      }
      send_json(res, 200, out);
    });
  });
  http_.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded("detokenize", res, [&] {
      check_auth(req);
      check_ready();
      const json body = parse_body(req);
      auto tokens = body.find("tokens");
      if (tokens == body.end() || !tokens->is_array()) throw bad_request("'tokens' must be an array of token ids", "tokens");
      std::vector<TokenId> ids;
      for (const auto& t : *tokens) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
            t.get<int64_t>() >= static_cast<int64_t>(engine_->tokenizer().n_vocab())) {
          throw bad_request("'tokens' holds an id outside the vocabulary of " +
                                std::to_string(engine_->tokenizer().n_vocab()), "tokens");
        }
        ids.push_back(static_cast<TokenId>(t.get<int64_t>()));
      }
      const std::string text = engine_->tokenizer().decode(ids);
      send_json(res, 200, {{"content", text}, {"prompt", text}});
    });
  });
}

void App::handle_generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  const auto arrival = Clock::now();
  guarded(endpoint == Endpoint::kChat ? "chat" : "completions", res, [&] {
    check_auth(req);
    check_ready();
    const json body = parse_body(req);
    GenerationRequest r = endpoint == Endpoint::kChat ? parse_chat_request(body) : parse_completion_request(body);
    if (!r.model.empty() && r.model != options_.model_id) {
      throw ApiError(404, "the model '" + r.model + "' does not exist; this server serves '" + options_.model_id + "'",
                     "model", "model_not_found");
    }
    auto job = std::make_shared<Job>();
    job->endpoint = endpoint;
    job->stream = r.stream;
    job->include_usage = r.stream && r.include_usage;
    job->top_logprobs = r.top_logprobs;
    job->arrival = arrival;
    job->meta = {random_id(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-"), unix_now(), options_.model_id};
    const text::Tokenizer& tok = engine_->tokenizer();
    if (endpoint == Endpoint::kChat) {
      job->chat = build_chat_prompt(chat_template_, r);
      job->prompts.push_back(tok.encode(job->chat.text, false, true));
      for (const auto& piece : job->chat.stop_pieces) {
        if (auto id = tok.find(piece)) job->options.stop_token_ids.push_back(*id);
      }
      job->options.render_special = job->chat.render_special;
    } else {
      for (const auto& text : r.prompt_texts) job->prompts.push_back(tok.encode(text, true, true));
      for (const auto& ids : r.prompt_ids) {
        for (TokenId t : ids) {
          if (static_cast<size_t>(t) >= tok.n_vocab()) {
            throw bad_request("token id " + std::to_string(t) + " is outside the vocabulary of " +
                                  std::to_string(tok.n_vocab()), "prompt");
          }
        }
        job->prompts.push_back(ids);
      }
    }
    // The context must hold the prompt and the completion: OpenAI's 400 with both numbers.
    const size_t n_ctx = engine_->n_ctx();
    size_t max_tokens = n_ctx;
    for (const auto& p : job->prompts) {
      if (p.empty()) throw bad_request("the prompt is empty", "prompt");
      if (p.size() >= n_ctx) {
        throw ApiError(400, "this model's maximum context length is " + std::to_string(n_ctx) +
                                " tokens, but the prompt has " + std::to_string(p.size()) + " tokens",
                       endpoint == Endpoint::kChat ? "messages" : "prompt", "context_length_exceeded");
      }
      const size_t room = n_ctx - p.size();
      const size_t want = r.max_tokens.value_or(room);
      if (p.size() + want > n_ctx) {
        throw ApiError(400, "this model's maximum context length is " + std::to_string(n_ctx) +
                                " tokens; you requested " + std::to_string(p.size() + want) + " tokens (" +
                                std::to_string(p.size()) + " in the prompt, " + std::to_string(want) +
                                " for the completion)",
                       "max_tokens", "context_length_exceeded");
      }
      max_tokens = std::min(max_tokens, want);
    }
    auto& o = job->options;
    o.max_tokens = max_tokens;  // without max_tokens: as many as the context holds
    o.sampler = r.sampler;
    o.sampler.seed = r.seed ? *r.seed : std::random_device{}();
    o.ignore_eos = r.ignore_eos;
    o.stop = r.stop;
    o.min_tokens = r.min_tokens;
    o.top_logprobs = r.top_logprobs;
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    // The charset parameter also keeps httplib from gzip-compressing the body: its compressor
    // holds small writes back, which would hide the heartbeats that detect a closed connection.
    res.set_chunked_content_provider(r.stream ? "text/event-stream" : "application/json; charset=utf-8",
                                     [this, job](size_t, httplib::DataSink& sink) {
                                       run_job(*job, sink);
                                       sink.done();
                                       return true;
                                     });
  });
}

runtime::TokenCallback App::token_callback(Job& job, const std::function<bool(const std::string&)>& write,
                                           bool& wrote, std::vector<runtime::StepLogprobs>& pending) {
  auto last = std::make_shared<Clock::time_point>();
  auto count = std::make_shared<size_t>(0);
  return [this, &job, &write, &wrote, &pending, last, count](TokenId, const runtime::StepLogprobs* lp) {
    const auto now = Clock::now();
    if ((*count)++ == 0) {
      metrics_.ttft(std::chrono::duration<double>(now - job.arrival).count());
    } else {
      metrics_.inter_token(std::chrono::duration<double>(now - *last).count());
    }
    *last = now;
    if (lp && job.stream) pending.push_back(*lp);
    // A token whose text is held back (a possible stop string, a tool call being collected)
    // writes nothing; the heartbeat makes a closed connection fail this step instead.
    bool alive = !stopping_;
    if (alive && !wrote && *count > 1) alive = write(job.stream ? std::string(":\n\n") : std::string(" "));
    wrote = false;
    return alive;
  };
}

void App::run_job(Job& job, httplib::DataSink& sink) {
  bool alive = true;
  std::function<bool(const std::string&)> write = [&](const std::string& s) {
    // (an empty chunk would end the chunked body: only probe the state then)
    if (alive && !s.empty() && !sink.write(s.data(), s.size())) alive = false;
    return alive;
  };
  metrics_.queue_enter();
  engine_lock_.lock();
  metrics_.queue_leave();
  metrics_.running(true);
  try {
    if (job.endpoint == Endpoint::kChat) {
      run_chat(job, write);
    } else {
      run_completion(job, write);
    }
  } catch (const std::exception& e) {
    const json err = ApiError::error_body(std::string("generation failed: ") + e.what(), "server_error", "", "");
    write(job.stream ? sse_event(err) : dump(err));
  }
  if (!alive) metrics_.cancelled();
  metrics_.request_latency(seconds_since(job.arrival));
  metrics_.running(false);
  engine_lock_.unlock();
}

void App::run_chat(Job& job, const std::function<bool(const std::string&)>& write) {
  runtime::Engine& engine = *engine_;
  const text::Tokenizer& tok = engine.tokenizer();
  text::ReplyParser parser(job.chat.reply_format, job.chat.parse_tools);
  std::vector<runtime::StepLogprobs> pending;
  size_t n_tool_calls = 0;
  bool wrote = true;
  auto logprobs_json = [&]() -> json {
    if (job.top_logprobs < 0 || pending.empty()) return nullptr;
    json lp = chat_logprobs(tok, pending);
    pending.clear();
    return lp;
  };
  auto send_events = [&](std::vector<text::ReplyEvent> events) {
    for (auto& e : events) {
      json delta;
      if (e.kind == text::ReplyEvent::Kind::kContent) {
        delta = {{"content", e.text}};
      } else if (e.kind == text::ReplyEvent::Kind::kReasoning) {
        delta = {{"reasoning_content", e.text}};
      } else {
        delta = {{"tool_calls", json::array({{{"index", n_tool_calls++},
                                               {"id", random_id("call_")},
                                               {"type", "function"},
                                               {"function", {{"name", e.call.name}, {"arguments", dump(e.call.arguments)}}}}})}};
      }
      write(sse_event(chat_chunk(job.meta, delta, "", logprobs_json(), job.include_usage)));
      wrote = true;
    }
  };
  auto& o = job.options;
  o.on_token = token_callback(job, write, wrote, pending);
  if (job.stream) {
    write(sse_event(chat_chunk(job.meta, {{"role", "assistant"}, {"content", ""}}, "", nullptr, job.include_usage)));
  }
  runtime::TextCallback on_text = [&](std::string_view piece) {
    if (job.stream) send_events(parser.feed(piece));
    return write("");
  };
  runtime::GenerateResult result = engine.generate(job.prompts[0], o, on_text);
  metrics_.tokens(result.prompt_tokens, result.tokens.size());
  if (result.cancelled) return;
  const json usage = usage_json(result.prompt_tokens, result.tokens.size());
  if (job.stream) {
    send_events(parser.finish());
    const std::string finish = n_tool_calls > 0 ? "tool_calls" : result.finish_reason;
    write(sse_event(chat_chunk(job.meta, json::object(), finish, logprobs_json(), job.include_usage)));
    if (job.include_usage) write(sse_event(usage_chunk(job.meta, "chat.completion.chunk", usage)));
    write(sse_done());
    return;
  }
  std::string content, reasoning;
  json tool_calls = json::array();
  for (auto& e : text::parse_reply(job.chat.reply_format, job.chat.parse_tools, result.text)) {
    if (e.kind == text::ReplyEvent::Kind::kContent) content += e.text;
    if (e.kind == text::ReplyEvent::Kind::kReasoning) reasoning += e.text;
    if (e.kind == text::ReplyEvent::Kind::kToolCall) {
      tool_calls.push_back({{"id", random_id("call_")},
                            {"type", "function"},
                            {"function", {{"name", e.call.name}, {"arguments", dump(e.call.arguments)}}}});
    }
  }
  json message = {{"role", "assistant"}, {"content", content.empty() && !tool_calls.empty() ? json(nullptr) : json(content)}};
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) message["tool_calls"] = tool_calls;
  json choice = {{"index", 0},
                 {"message", message},
                 {"logprobs", job.top_logprobs >= 0 ? chat_logprobs(tok, result.logprobs) : json(nullptr)},
                 {"finish_reason", tool_calls.empty() ? result.finish_reason : "tool_calls"}};
  write(dump({{"id", job.meta.id},
              {"object", "chat.completion"},
              {"created", job.meta.created},
              {"model", job.meta.model},
              {"system_fingerprint", "kestrel-" KESTREL_VERSION},
              {"choices", json::array({choice})},
              {"usage", usage}}));
}

void App::run_completion(Job& job, const std::function<bool(const std::string&)>& write) {
  runtime::Engine& engine = *engine_;
  const text::Tokenizer& tok = engine.tokenizer();
  size_t prompt_tokens = 0, completion_tokens = 0;
  json choices = json::array();
  for (size_t i = 0; i < job.prompts.size(); ++i) {
    std::vector<runtime::StepLogprobs> pending;
    bool wrote = true;
    size_t offset = 0;
    auto o = job.options;
    o.on_token = token_callback(job, write, wrote, pending);
    runtime::TextCallback on_text = [&](std::string_view piece) {
      if (!job.stream) return write("");
      json lp = nullptr;
      if (job.top_logprobs >= 0 && !pending.empty()) {
        lp = completion_logprobs(tok, pending, offset);
        pending.clear();
      }
      offset += piece.size();
      json chunk = completion_object(job.meta, json::array({completion_choice(i, std::string(piece), "", lp)}), nullptr);
      if (job.include_usage) chunk["usage"] = nullptr;
      wrote = true;
      return write(sse_event(chunk));
    };
    runtime::GenerateResult result = engine.generate(job.prompts[i], o, on_text);
    metrics_.tokens(result.prompt_tokens, result.tokens.size());
    if (result.cancelled) return;
    prompt_tokens += result.prompt_tokens;
    completion_tokens += result.tokens.size();
    if (job.stream) {
      json lp = job.top_logprobs >= 0 && !pending.empty() ? completion_logprobs(tok, pending, offset) : json(nullptr);
      json chunk = completion_object(job.meta, json::array({completion_choice(i, "", result.finish_reason, lp)}), nullptr);
      if (job.include_usage) chunk["usage"] = nullptr;
      write(sse_event(chunk));
    } else {
      json lp = job.top_logprobs >= 0 ? completion_logprobs(tok, result.logprobs, 0) : json(nullptr);
      choices.push_back(completion_choice(i, result.text, result.finish_reason, lp));
    }
  }
  const json usage = usage_json(prompt_tokens, completion_tokens);
  if (job.stream) {
    if (job.include_usage) write(sse_event(usage_chunk(job.meta, "text_completion", usage)));
    write(sse_done());
  } else {
    write(dump(completion_object(job.meta, choices, usage)));
  }
}

}  // namespace

int serve(const ServerOptions& options, const EngineLoader& load) {
  // SIGINT/SIGTERM are taken by one thread (sigwait) that stops the server; every other thread
  // inherits the blocked mask. A closed client socket must not kill the process (SIGPIPE).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  App app(options);
  app.install_routes();
  httplib::Server& http = app.http();
  int port = options.port;
  if (port == 0) {
    port = http.bind_to_any_port(options.host);
    if (port < 0) throw Error("cannot bind " + options.host + " to a free port");
  } else if (!http.bind_to_port(options.host, port)) {
    throw Error("cannot listen on " + options.host + ":" + std::to_string(port) + " (in use, or not an address here)");
  }
  std::thread listener([&] { http.listen_after_bind(); });
  std::thread signal_waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    app.stop_generating();
    http.stop();
  });
  std::fprintf(stderr, "kestrel serve: listening on http://%s:%d\n", options.host.c_str(), port);
  std::exception_ptr failure;
  try {
    app.set_engine(load());
    std::fprintf(stderr, "kestrel serve: ready; model '%s'\n", options.model_id.c_str());
  } catch (...) {
    failure = std::current_exception();
    kill(getpid(), SIGTERM);  // wakes the signal thread, which stops the server
  }
  signal_waiter.join();
  listener.join();
  if (failure) std::rethrow_exception(failure);
  std::fprintf(stderr, "kestrel serve: stopped\n");
  return 0;
}

}  // namespace kestrel::server
