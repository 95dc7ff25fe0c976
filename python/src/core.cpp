#include "core.h"

#include <algorithm>
#include <random>
#include <utility>

#include "kestrel/kernels/attention_kv.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/quant/precision.h"
#include "kestrel/runtime/model_path.h"
#include "kestrel/server/api_error.h"
#include "kestrel/server/openai_format.h"
#include "kestrel/server/request.h"
#include "kestrel/server/tool_grammar.h"

namespace kestrel::python {

void ModelLock::acquire(TokenStream* stream) {
  std::unique_lock<std::mutex> lock(mutex_);
  free_.wait(lock, [this] { return !busy_; });
  busy_ = true;
  owner_ = std::this_thread::get_id();
  stream_ = stream;
}

void ModelLock::release() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    stream_ = nullptr;
  }
  free_.notify_one();
}

TokenStream* ModelLock::stream_left_open_by_this_thread() {
  std::lock_guard<std::mutex> lock(mutex_);
  return busy_ && owner_ == std::this_thread::get_id() ? stream_ : nullptr;
}

void ModelLock::set_owner_thread() {
  std::lock_guard<std::mutex> lock(mutex_);
  owner_ = std::this_thread::get_id();
}

namespace {

runtime::EngineOptions engine_options(const LoadArgs& a) {
  if (a.threads < 0 || a.threads > 256) throw InvalidArgument("threads must be 0 (every core) to 256");
  runtime::EngineOptions o;
  o.n_threads = a.threads;
  o.n_ctx = a.n_ctx;
  o.load.precision = quant::parse_precision(a.precision);
  if (a.head != "auto" && a.head != "dense" && a.head != "flash") {
    throw InvalidArgument("head must be 'auto', 'dense' or 'flash', not '" + a.head + "'");
  }
  o.head = a.head == "dense" ? runtime::HeadMode::kDense
           : a.head == "flash" ? runtime::HeadMode::kFlash
                               : runtime::HeadMode::kAuto;
  o.probes = a.probes;
  o.load.decode_activations = kernels::parse_decode_activations(a.decode_act);
  try {
    o.load.kv_types = {kernels::parse_kv_type(a.cache_type_k, "cache_type_k"),
                       kernels::parse_kv_type(a.cache_type_v, "cache_type_v")};
  } catch (const kestrel::Error& e) {
    throw InvalidArgument(e.what());
  }
  return o;
}

}  // namespace

std::shared_ptr<Core> load(const LoadArgs& args) {
  const runtime::EngineOptions options = engine_options(args);
  auto core = std::make_shared<Core>();
  runtime::RunnableModel m = runtime::runnable_model(args.model, args.precision == "auto");
  if (std::filesystem::is_directory(m.path)) {
    throw InvalidArgument(m.path.string() + " is a directory (a Hugging Face checkpoint?); build an image from "
                          "it first: kestrel build " + m.path.string() + " -o model.kimg");
  }
  try {
    core->engine = std::make_unique<runtime::Engine>(m.path, options);
  } catch (const runtime::OptionMismatch&) {
    throw;
  } catch (const Error& e) {
    if (!m.default_image) throw;
    // As the CLI: a cached default image from an older Kestrel (or damaged) gives way to the GGUF.
    core->warning = "the default image " + m.path.string() + " does not load (" + e.what() +
                    "); running the default GGUF instead. Rebuild it with `kestrel build default --as-default`";
    m = {runtime::default_model_path()};
    core->engine = std::make_unique<runtime::Engine>(m.path, options);
  }
  core->path = m.path.string();
  if (args.draft_model) {
    runtime::EngineOptions d = options;
    d.head = runtime::HeadMode::kAuto;
    d.probes = 0;
    const std::string draft = *args.draft_model == "default"
                                  ? runtime::runnable_model("default", args.precision == "auto").path.string()
                                  : *args.draft_model;
    core->engine->load_draft_model(draft, d);
  }
  core->chat_template = server::detect_chat_template(core->engine->tokenizer());
  return core;
}

namespace {

void check_prompt(const Core& core, const std::vector<TokenId>& prompt, size_t max_tokens) {
  const size_t n_vocab = core.engine->tokenizer().n_vocab();
  if (prompt.empty()) throw InvalidArgument("the prompt is empty");
  for (TokenId t : prompt) {
    if (t < 0 || static_cast<size_t>(t) >= n_vocab) {
      throw InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(n_vocab));
    }
  }
  const size_t n_ctx = core.engine->n_ctx();
  if (prompt.size() >= n_ctx) {
    throw ContextLengthExceeded("the prompt has " + std::to_string(prompt.size()) +
                                " tokens; the context (n_ctx) holds " + std::to_string(n_ctx) +
                                ", and one more position is needed for the first generated token");
  }
  (void)max_tokens;  // generation stops with finish_reason "length" when the context is full
}

void set_draft(runtime::GenerateOptions& o, const Core& core, const std::string& draft, size_t draft_max,
               const std::string& draft_accept) {
  if (draft == "none") {
    o.draft = runtime::DraftMode::kNone;
  } else if (draft == "ngram") {
    o.draft = runtime::DraftMode::kNgram;
  } else if (draft == "auto") {
    o.draft = runtime::DraftMode::kAuto;
  } else if (draft == "model") {
    if (core.engine->draft_model() == nullptr) {
      throw InvalidArgument("draft='model' needs a draft model: kestrel.Model(..., draft_model=PATH)");
    }
    o.draft = runtime::DraftMode::kModel;
  } else {
    throw InvalidArgument("draft must be 'auto', 'none', 'ngram' or 'model', not '" + draft + "'");
  }
  if (draft_max > runtime::kMaxDraft) {
    throw InvalidArgument("draft_max must be 0 to " + std::to_string(runtime::kMaxDraft));
  }
  o.draft_max = draft_max;
  if (draft_accept != "exact" && draft_accept != "distribution") {
    throw InvalidArgument("draft_accept must be 'exact' or 'distribution', not '" + draft_accept + "'");
  }
  o.draft_accept = runtime::parse_draft_accept(draft_accept);
}

void check_sampler(const runtime::SamplerConfig& s) {
  if (!(s.temperature >= 0.0f && s.temperature <= 100.0f)) throw InvalidArgument("temperature must be 0 to 100");
  if (!(s.top_p >= 0.0f && s.top_p <= 1.0f)) throw InvalidArgument("top_p must be 0 to 1");
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) throw InvalidArgument("min_p must be 0 to 1");
  if (!(s.repeat_penalty >= 0.01f && s.repeat_penalty <= 100.0f)) throw InvalidArgument("repeat_penalty must be 0.01 to 100");
  if (s.repeat_last_n < -1) throw InvalidArgument("repeat_last_n must be -1 (all) or more");
  if (!(s.presence_penalty >= -2.0f && s.presence_penalty <= 2.0f)) throw InvalidArgument("presence_penalty must be -2 to 2");
  if (!(s.frequency_penalty >= -2.0f && s.frequency_penalty <= 2.0f)) throw InvalidArgument("frequency_penalty must be -2 to 2");
}

}  // namespace

Request make_request(Core& core, std::vector<TokenId> prompt, const GenerateArgs& a, bool cache_prompt) {
  check_prompt(core, prompt, a.max_tokens);
  check_sampler(a.sampler);
  if (a.logprobs < -1 || a.logprobs > 20) throw InvalidArgument("logprobs must be None or 0 to 20");
  if (a.min_tokens > a.max_tokens) throw InvalidArgument("min_tokens must not exceed max_tokens");
  Request r;
  r.prompt = std::move(prompt);
  auto& o = r.options;
  o.max_tokens = a.max_tokens;
  o.sampler = a.sampler;
  o.sampler.seed = a.seed ? *a.seed : std::random_device{}();
  o.stop = a.stop;
  for (const auto& s : o.stop) {
    if (s.empty()) throw InvalidArgument("a stop string is empty");
  }
  o.ignore_eos = a.ignore_eos;
  o.min_tokens = a.min_tokens;
  o.top_logprobs = a.logprobs;
  o.cache_prompt = cache_prompt;
  const size_t n_vocab = core.engine->tokenizer().n_vocab();
  for (const auto& [id, bias] : a.logit_bias) {
    if (id < 0 || static_cast<uint64_t>(id) >= n_vocab) {
      throw InvalidArgument("logit_bias names token " + std::to_string(id) + ", outside the vocabulary of " +
                            std::to_string(n_vocab));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) throw InvalidArgument("a logit_bias value must be -100 to 100");
    o.logit_bias.emplace_back(static_cast<TokenId>(id), bias);
  }
  std::sort(o.logit_bias.begin(), o.logit_bias.end());
  for (size_t i = 1; i < o.logit_bias.size(); ++i) {
    if (o.logit_bias[i].first == o.logit_bias[i - 1].first) throw InvalidArgument("logit_bias names a token twice");
  }
  set_draft(o, core, a.draft, a.draft_max, a.draft_accept);
  using Kind = runtime::GrammarSpec::Kind;
  const int n_structured = int(a.json_schema.has_value()) + int(a.grammar.has_value()) + int(a.regex.has_value());
  if (n_structured > 1) throw InvalidArgument("give at most one of json_schema, grammar and regex");
  if (n_structured == 1 && !o.stop.empty()) {
    throw InvalidArgument("stop cannot be combined with structured output: a stop string would cut the answer "
                          "the grammar shapes");
  }
  std::optional<runtime::GrammarSpec> spec;
  if (a.json_schema) spec = runtime::GrammarSpec{Kind::kJsonSchema, *a.json_schema};
  if (a.grammar) spec = runtime::GrammarSpec{Kind::kEbnf, *a.grammar};
  if (a.regex) spec = runtime::GrammarSpec{Kind::kRegex, *a.regex};
  if (spec) o.grammar = core.engine->grammars().compile(*spec);
  return r;
}

Request make_chat_request(Core& core, const std::string& body_text, const std::string& draft, size_t draft_max,
                          const std::string& draft_accept, bool cache_prompt) {
  // The server's path for /v1/chat/completions (server/app.cpp, handle_generate), minus HTTP.
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(body_text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(std::string("the chat request is not valid JSON: ") + e.what());
  }
  server::GenerationRequest r = server::parse_chat_request(body);
  const text::Tokenizer& tok = core.engine->tokenizer();
  if (server::forces_tool_call(r)) {
    if (r.grammar) {
      throw server::bad_request("'" + r.grammar_param + "' cannot be combined with a tool_choice that forces a call",
                                r.grammar_param);
    }
    try {
      r.grammar = server::forced_tool_grammar(core.chat_template, r, tok);
    } catch (const runtime::InvalidGrammar& e) {
      throw server::bad_request(e.what(), "tools");
    }
    r.grammar_param = "tools";
  }
  if (r.grammar && !r.stop.empty()) {
    throw server::bad_request("'stop' cannot be combined with structured output ('" + r.grammar_param +
                                  "'): a stop string would cut the answer the grammar shapes", "stop");
  }
  Request out;
  auto& o = out.options;
  if (r.grammar) {
    if (r.grammar->kind == runtime::GrammarSpec::Kind::kJsonSchema) {
      r.grammar->text = server::schema_in_client_order(body_text, r.schema_pointer);
    }
    try {
      o.grammar = core.engine->grammars().compile(*r.grammar);
    } catch (const runtime::InvalidGrammar& e) {
      throw server::bad_request(e.what(), r.grammar_param);
    }
  }
  out.chat = true;
  out.chat_prompt = server::build_chat_prompt(core.chat_template, r);
  out.prompt = tok.encode(out.chat_prompt.text, false, true);
  for (const auto& piece : out.chat_prompt.stop_pieces) {
    if (auto id = tok.find(piece)) o.stop_token_ids.push_back(*id);
  }
  o.render_special = out.chat_prompt.render_special;
  const size_t n_ctx = core.engine->n_ctx();
  if (out.prompt.size() >= n_ctx) {
    throw ContextLengthExceeded("this model's context (n_ctx) is " + std::to_string(n_ctx) +
                                " tokens, but the messages have " + std::to_string(out.prompt.size()) + " tokens");
  }
  const size_t room = n_ctx - out.prompt.size();
  const size_t want = r.max_tokens.value_or(room);
  if (want > room) {
    throw ContextLengthExceeded("this model's context (n_ctx) is " + std::to_string(n_ctx) + " tokens; you asked for " +
                                std::to_string(out.prompt.size() + want) + " (" + std::to_string(out.prompt.size()) +
                                " in the messages, " + std::to_string(want) + " for the completion)");
  }
  o.max_tokens = want;
  o.sampler = r.sampler;
  o.sampler.seed = r.seed ? *r.seed : std::random_device{}();
  o.ignore_eos = r.ignore_eos;
  o.stop = r.stop;
  o.min_tokens = r.min_tokens;
  o.top_logprobs = r.top_logprobs;
  for (const auto& [id, bias] : r.logit_bias) {
    if (static_cast<uint64_t>(id) >= tok.n_vocab()) {
      throw server::bad_request("'logit_bias' names token " + std::to_string(id) + ", outside the vocabulary of " +
                                    std::to_string(tok.n_vocab()), "logit_bias");
    }
    o.logit_bias.emplace_back(static_cast<TokenId>(id), bias);
  }
  o.cache_prompt = cache_prompt;
  set_draft(o, core, draft, draft_max, draft_accept);
  return out;
}

nlohmann::json result_json(const Core& core, const Request& request, const runtime::GenerateResult& result) {
  const text::Tokenizer& tok = core.engine->tokenizer();
  nlohmann::json j = {{"text", result.text},
                      {"tokens", result.tokens},
                      {"finish_reason", result.finish_reason},
                      {"prompt_tokens", result.prompt_tokens},
                      {"cached_tokens", result.cached_tokens},
                      {"ttft_ms", result.ttft_ms},
                      {"prefill_tok_s", result.prefill_tok_s},
                      {"decode_tok_s", result.decode_tok_s},
                      {"drafted_tokens", result.drafted_tokens},
                      {"accepted_tokens", result.accepted_tokens},
                      {"cancelled", result.cancelled}};
  if (request.options.top_logprobs < 0) {
    j["logprobs"] = nullptr;
  } else {
    auto entry = [&](const runtime::TokenLogprob& t) {
      return nlohmann::json{{"id", t.token}, {"token", tok.token_to_piece(t.token, true)}, {"logprob", t.logprob}};
    };
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& s : result.logprobs) {
      nlohmann::json e = entry(s.chosen);
      e["top_logprobs"] = nlohmann::json::array();
      for (const auto& t : s.top) e["top_logprobs"].push_back(entry(t));
      steps.push_back(std::move(e));
    }
    j["logprobs"] = std::move(steps);
    if (request.chat) j["chat_logprobs"] = server::chat_logprobs(tok, result.logprobs);
  }
  return j;
}

runtime::GenerateResult run(Sequence& seq, const Request& request, const std::function<bool()>& keep_going) {
  runtime::GenerateOptions o = request.options;
  if (keep_going) {
    o.on_token = [&keep_going](TokenId, const runtime::StepLogprobs*) { return keep_going(); };
  }
  ModelLock& lock = seq.core->lock;
  lock.acquire(nullptr);
  try {
    runtime::GenerateResult result = seq.session().generate(request.prompt, o);
    lock.release();
    return result;
  } catch (...) {
    lock.release();
    throw;
  }
}

void step(runtime::Generation& g, runtime::Session& session, size_t prompt_size) {
  // One iteration of runtime::Session::generate's loop.
  g.draft();
  const auto in = g.input(std::max(prompt_size, runtime::kMaxDraft + 1));
  if (!g.prefilling() && in.size() > 1) {
    g.advance_rows(in.size(), session.step_rows(in));
  } else {
    g.advance(in.size(), session.step(in));
  }
}

}  // namespace kestrel::python
