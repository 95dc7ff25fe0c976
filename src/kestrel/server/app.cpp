// Routes and admission: authentication, validation, prompts, the context check.
#include <random>

#include "kestrel/server/api_error.h"
#include "kestrel/runtime/kernels_report.h"
#include "kestrel/server/app.h"
#include "kestrel/server/tool_grammar.h"
#include "kestrel/text/reply_parser.h"

namespace kestrel::server {


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



void App::guarded(const char* endpoint, httplib::Response& res, const std::function<void()>& body, Wire wire) {
  try {
    body();
  } catch (const ApiError& e) {
    send_json(res, e.status(), wire == Wire::kMessages ? anthropic_error(e.status(), e.what()) : e.body());
    if (e.status() == 429) res.set_header("Retry-After", "1");
  } catch (const std::exception& e) {
    const std::string message = std::string("internal error: ") + e.what();
    send_json(res, 500, wire == Wire::kMessages ? anthropic_error(500, message)
                                                : ApiError::error_body(message, "server_error", "", ""));
  }
  metrics_.request(endpoint, res.status);
}

nlohmann::ordered_json App::parse_ordered_body(const std::string& text) const {
  parse_body(text);  // depth, validity and object checks
  return nlohmann::ordered_json::parse(text);
}

json App::model_object() const {
  return {{"id", options_.model_id},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "kestrel"},
          {"max_model_len", engine_->n_ctx()}};
}

void App::check_model_name(const std::string& name) const {
  if (name == options_.model_id || (!options_.model_alias.empty() && name == options_.model_alias)) return;
  const std::string alias = options_.model_alias.empty() ? "" : " (also named '" + options_.model_alias + "')";
  throw ApiError(404, "the model '" + name + "' does not exist; this server serves '" + options_.model_id + "'" + alias,
                 "model", "model_not_found");
}

void App::check_auth(const httplib::Request& req) const {
  if (options_.api_key.empty()) return;
  // Anthropic's clients send the key as x-api-key.
  const std::string header = req.has_header("x-api-key") && !req.has_header("Authorization")
                                 ? "Bearer " + req.get_header_value("x-api-key")
                                 : req.get_header_value("Authorization");
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

json App::parse_body(const std::string& text) const {
  if (json_nesting_depth(text) > kMaxJsonDepth) {
    throw bad_request("the request body nests arrays/objects deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  json body = json::parse(text, nullptr, false);
  if (body.is_discarded()) throw bad_request("the request body is not valid JSON");
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  return body;
}

void App::post(const std::string& pattern, PostHandler handler) {
  // GET on a POST route (a browser, a typo'd client): 405 with Allow, as HTTP and the OpenAI
  // servers answer, not 404 "no such endpoint".
  http_.Get(pattern, [](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Allow", "POST");
    send_json(res, 405, ApiError::error_body("method " + req.method + " is not allowed on " + req.path + "; use POST",
                                             "invalid_request_error", "", ""));
  });
  // httplib's own body reading treats a body labelled application/x-www-form-urlencoded (what
  // `curl -d` sends without -H) as a form and refuses one over 8 KiB with 413; it also does not
  // bound a chunked body. Every body here is JSON, whatever its Content-Type says, so the route
  // reads it itself: at most options.max_body_bytes (413 beyond).
  http_.Post(pattern, [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                                           const httplib::ContentReader& read) {
    std::string body;
    bool too_large = false;
    const httplib::ContentReceiver append = [&](const char* data, size_t n) {
      // Past the limit the rest is read and dropped (as httplib skips a Content-Length body over
      // it), so that the client, still sending, reads the 413 instead of a reset connection.
      too_large = too_large || body.size() + n > options_.max_body_bytes;
      if (!too_large) body.append(data, n);
      return true;
    };
    if (req.is_multipart_form_data()) {
      // Read (and drop) the parts, so that the connection stays in step, then refuse.
      read([](const httplib::MultipartFormData&) { return true; }, [](const char*, size_t) { return true; });
      send_json(res, 415, ApiError::error_body("the request body must be JSON (Content-Type: application/json), "
                                               "not multipart/form-data", "invalid_request_error", "", ""));
      return;
    }
    if (!read(append) || too_large) {
      // httplib sets 413 for a Content-Length over the limit (the error handler says so), 400 for
      // a broken body (a bad chunk, a connection closed early).
      if (too_large) res.status = 413;
      if (res.status != 413) {
        send_json(res, 400, ApiError::error_body("the request body could not be read", "invalid_request_error", "", ""));
      }
      return;
    }
    handler(req, res, body);
  });
}

void App::install_routes() {
  http_.set_payload_max_length(options_.max_body_bytes);
  // An idle keep-alive connection holds an HTTP thread, and cpp-httplib 0.11 looks for a stop
  // only between a connection's requests: with its default of 5 s, SIGTERM waited 5 s for any
  // client whose connection pool kept a connection open (the openai client's, a browser's).
  http_.set_keep_alive_timeout(kKeepAliveSeconds);
  // Enough threads that /health and /metrics are answered while every admitted request (running
  // or waiting, each holding its connection's thread) streams: http_thread_count.
  http_.new_task_queue = [n = http_thread_count(options_)] { return new httplib::ThreadPool(n); };
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
  // The access log and the count of every response: the request's record starts before
  // routing, and the logger runs once the response (a stream's too) has been written.
  http_.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    current_request() = RequestRecord{Clock::now()};
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.response(res.status);
    if (!options_.quiet) {
      write_log_line(access_line(log_format_, req.remote_addr, req.method, req.path, res.status, current_request()));
    }
    current_request() = RequestRecord{};
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
      send_json(res, 200, {{"object", "list"}, {"data", json::array({model_object()})}});
    });
  });
  // One model, as OpenAI's GET /v1/models/{model} (the openai client's models.retrieve): the
  // served model under its name or its alias, 404 model_not_found for any other name.
  http_.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    guarded("models", res, [&] {
      check_auth(req);
      check_ready();
      check_model_name(req.matches[1].str());
      send_json(res, 200, model_object());
    });
  });
  http_.Get("/props", [this](const httplib::Request& req, httplib::Response& res) {
    guarded("props", res, [&] {
      check_auth(req);
      check_ready();
      send_json(res, 200, props());
    });
  });
  install_webui_routes();
  install_wire_routes();
  install_embeddings_routes();
  post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res, const std::string& body) {
    handle_generate(req, res, body, Endpoint::kChat);
  });
  post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res, const std::string& body) {
    handle_generate(req, res, body, Endpoint::kCompletion);
  });
  post("/tokenize", [this](const httplib::Request& req, httplib::Response& res, const std::string& raw) {
    guarded("tokenize", res, [&] {
      check_auth(req);
      check_ready();
      const json body = parse_body(raw);
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
        // add_special_tokens is vLLM's name (lm-eval's tokenizer probe sends it), add_special llama-server's.
        const bool add_special = body.contains("add_special_tokens") ? flag("add_special_tokens") : flag("add_special");
        tokens = engine_->tokenizer().encode(text->get<std::string>(), add_special, flag("parse_special"));
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
  // vLLM's GET /tokenizer_info: what lm-eval's remote tokenizer backend reads (its special tokens).
  http_.Get("/tokenizer_info", [this](const httplib::Request& req, httplib::Response& res) {
    guarded("tokenizer_info", res, [&] {
      check_auth(req);
      check_ready();
      const text::Tokenizer& tok = engine_->tokenizer();
      auto piece = [&](TokenId id) { return id < 0 ? json(nullptr) : json(tok.token_to_piece(id, true)); };
      send_json(res, 200, {{"tokenizer_class", "kestrel"},
                           {"bos_token", piece(tok.bos())},
                           {"eos_token", piece(tok.eos())},
                           {"pad_token", nullptr},
                           {"model_max_length", engine_->n_ctx()},
                           {"vocab_size", tok.n_vocab()}});
    });
  });
  post("/detokenize", [this](const httplib::Request& req, httplib::Response& res, const std::string& raw) {
    guarded("detokenize", res, [&] {
      check_auth(req);
      check_ready();
      const json body = parse_body(raw);
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

json App::props() const {
  const head::FlashHead* flash = engine_->flashhead();
  json flashhead = {{"enabled", flash != nullptr}};
  if (flash != nullptr) {
    flashhead["probes"] = engine_->probes();
    flashhead["clusters"] = flash->n_clusters();
  }
  // The image's Gemma 4 MTP assistant, which --draft auto drafts with (other drafters leave it idle).
  json assistant = nullptr;
  if (const model::MtpAssistant* mtp = engine_->mtp_assistant()) {
    assistant = {{"kind", "gemma4-mtp"},
                 {"layers", mtp->config().n_layers},
                 {"width", mtp->config().d_model},
                 {"drafting", draft_mode_ == runtime::DraftMode::kAuto}};
  }
  return {{"model", options_.model_id},
          {"version", KESTREL_VERSION},
          {"n_ctx", engine_->n_ctx()},
          {"parallel", scheduler_->n_sessions()},
          {"prefix_cache", scheduler_->prefix_cache_stats() == nullptr
                               ? json(nullptr)
                               : json{{"max_bytes", options_.cache_ram_mib << 20},
                                      {"block_tokens", scheduler_->prefix_block_tokens()},
                                      {"dir", options_.cache_dir.empty() ? json(nullptr) : json(options_.cache_dir)}}},
          {"batch_exactness", engine_->model().batch_exactness() == model::BatchExactness::kAnyRows ? "any-rows"
                                                                                                   : "short-apart"},
          {"chat_format", chat_template_ == ChatTemplate::kGemma4 ? "gemma4" : "gemma3"},
          {"instruction_tuned", engine_->has_chat_template()},
          {"flashhead", flashhead},
          {"kernels", runtime::kernels_json(engine_->model().info())},
          {"speculative", draft_mode_ == runtime::DraftMode::kNone || options_.draft_max == 0
                              ? json(nullptr)
                              : json{{"draft", options_.draft},
                                     {"draft_max", options_.draft_max},
                                     {"draft_accept", runtime::draft_accept_name(draft_accept_)},
                                     {"mtp_assistant", assistant}}}};
}

std::shared_ptr<void> App::admit() {
  // The place is released when the Job (which the response's content provider holds) goes,
  // whether it ran, failed, or its client left before it started.
  if (admitted_.fetch_add(1) >= options_.max_queue) {
    admitted_.fetch_sub(1);
    throw ApiError(429, "the server is busy: its queue (--queue " + std::to_string(options_.max_queue) +
                            ", running and waiting requests together) is full; retry later",
                   "", "rate_limit_exceeded", "requests");
  }
  return std::shared_ptr<void>(nullptr, [this](void*) { admitted_.fetch_sub(1); });
}

namespace {

// A chat request's field under the name the client's API gives it (the Responses and Messages
// APIs run as chat requests; their 400s name their own fields).
std::string wire_param(Wire wire, const std::string& param) {
  auto starts = [&](const char* prefix) { return param.rfind(prefix, 0) == 0; };
  if (wire == Wire::kResponses) {
    if (param == "max_tokens") return "max_output_tokens";
    if (starts("response_format")) return "text.format";
    if (starts("messages")) return "input";
  }
  if (wire == Wire::kMessages) {
    if (starts("tools[") && param.find(".function.parameters") != std::string::npos) {
      return param.substr(0, param.find(".function.parameters")) + ".input_schema";
    }
    if (param == "stop") return "stop_sequences";
  }
  return param;
}

}  // namespace

void App::handle_generate(const httplib::Request& req, httplib::Response& res, const std::string& client_raw,
                          Endpoint endpoint, Wire wire) {
  const auto arrival = Clock::now();
  const char* name = wire == Wire::kResponses ? "responses"
                     : wire == Wire::kMessages ? "messages"
                     : endpoint == Endpoint::kChat ? "chat" : "completions";
  guarded(name, res, [&] {
    check_auth(req);
    check_ready();
    // The Responses and Messages APIs run as the chat request they translate into.
    std::shared_ptr<ResponsesRequest> responses;
    std::shared_ptr<MessagesRequest> messages;
    std::string translated;
    if (wire == Wire::kResponses) {
      responses = std::make_shared<ResponsesRequest>(responses_to_chat(parse_ordered_body(client_raw), responses_));
      translated = responses->chat.dump();
    } else if (wire == Wire::kMessages) {
      messages = std::make_shared<MessagesRequest>(messages_to_chat(parse_ordered_body(client_raw), false));
      translated = messages->chat.dump();
    }
    const std::string& raw = wire == Wire::kOpenAI ? client_raw : translated;
    const json body = parse_body(raw);
    GenerationRequest r;
    try {
      r = endpoint == Endpoint::kChat ? parse_chat_request(body) : parse_completion_request(body);
    } catch (const ApiError& e) {
      if (wire == Wire::kOpenAI) throw;
      throw ApiError(e.status(), e.what(), wire_param(wire, e.body()["error"].value("param", json("")).is_string()
                                                                ? e.body()["error"]["param"].get<std::string>()
                                                                : std::string()),
                     e.body()["error"]["code"].is_string() ? e.body()["error"]["code"].get<std::string>() : "",
                     e.body()["error"]["type"].get<std::string>());
    }
    if (!r.model.empty()) check_model_name(r.model);
    // tool_choice "required" or a named function: the reply is forced through a grammar of the
    // model's call format (docs/serving.md#forced-tool-calls).
    if (endpoint == Endpoint::kChat && forces_tool_call(r)) {
      if (r.grammar) {
        throw bad_request("'" + r.grammar_param + "' cannot be combined with tool_choice '" +
                              (r.tool_choice_named ? "{function: " + r.tool_choice + "}" : r.tool_choice) +
                              "', which already decides the answer's shape", r.grammar_param);
      }
      try {
        r.grammar = forced_tool_grammar(chat_template_, r, engine_->tokenizer());
      } catch (const runtime::InvalidGrammar& e) {
        throw bad_request(e.what(), "tools");
      }
      r.grammar_param = "tools";
    }
    // Compiled before the request takes a place: a schema or grammar that does not compile, or
    // a keyword that would not be enforced, is the client's 400 naming the field.
    std::shared_ptr<const runtime::CompiledGrammar> grammar;
    if (r.grammar && !r.stop.empty()) {
      throw bad_request("'stop' cannot be combined with structured output ('" + r.grammar_param +
                            "'): a stop string would cut the answer the grammar shapes", "stop");
    }
    if (r.grammar) {
      if (r.grammar->kind == runtime::GrammarSpec::Kind::kJsonSchema) {
        r.grammar->text = schema_in_client_order(raw, r.schema_pointer);
      }
      try {
        grammar = engine_->grammars().compile(*r.grammar);
      } catch (const runtime::InvalidGrammar& e) {
        throw bad_request(e.what(), r.grammar_param);
      }
    }
    auto job = std::make_shared<Job>();
    job->admission = admit();
    job->endpoint = endpoint;
    job->wire = wire;
    job->responses = std::move(responses);
    job->messages = std::move(messages);
    job->stream = r.stream;
    job->include_usage = r.stream && r.include_usage;
    job->top_logprobs = r.top_logprobs;
    job->n = r.n;
    job->best_of = r.best_of;
    job->arrival = arrival;
    const char* id_prefix = wire == Wire::kResponses ? "resp_"
                            : wire == Wire::kMessages ? "msg_"
                            : endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-";
    job->meta = {random_id(id_prefix), unix_now(), options_.model_id};
    const text::Tokenizer& tok = engine_->tokenizer();
    if (endpoint == Endpoint::kChat) {
      job->chat = build_chat_prompt(chat_template_, r);
      job->prompts.push_back(tok.encode(job->chat.text, false, true));
      for (const auto& piece : job->chat.stop_pieces) {
        if (auto id = tok.find(piece)) job->options.stop_token_ids.push_back(*id);
      }
      job->options.render_special = job->chat.render_special;
    } else {
      for (const auto& text : r.prompt_texts) {
        job->prompts.push_back(tok.encode(text, true, true));
        job->prompt_texts.push_back(text);
      }
      for (const auto& ids : r.prompt_ids) {
        for (TokenId t : ids) {
          if (static_cast<size_t>(t) >= tok.n_vocab()) {
            throw bad_request("token id " + std::to_string(t) + " is outside the vocabulary of " +
                                  std::to_string(tok.n_vocab()), "prompt");
          }
        }
        job->prompts.push_back(ids);
        if (r.echo) job->prompt_texts.push_back(tok.decode(job->prompts.back()));
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
    job->echo = r.echo;
    job->prompt_logprobs = r.prompt_logprobs;
    // Prompt scoring (echo with logprobs, prompt_logprobs): a prefill that keeps every row.
    if (r.echo && r.top_logprobs >= 0) o.prompt_logprobs = r.top_logprobs;
    o.prompt_logprobs = std::max(o.prompt_logprobs, r.prompt_logprobs);
    // best_of ranks the samples by their tokens' summed logprob: collected whether asked or not.
    job->user_logprobs = r.top_logprobs >= 0;
    if (r.best_of > r.n && o.top_logprobs < 0) o.top_logprobs = 0;
    for (const auto& [id, bias] : r.logit_bias) {
      if (static_cast<uint64_t>(id) >= tok.n_vocab()) {
        throw bad_request("'logit_bias' names token " + std::to_string(id) + ", outside the vocabulary of " +
                              std::to_string(tok.n_vocab()), "logit_bias");
      }
      o.logit_bias.emplace_back(static_cast<TokenId>(id), bias);
    }
    o.cache_prompt = r.cache_prompt;
    o.draft = draft_mode_;
    o.draft_max = options_.draft_max;
    o.draft_accept = draft_accept_;
    o.grammar = std::move(grammar);
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
  }, wire);
}


}  // namespace kestrel::server
