// Running an admitted request through the scheduler: streaming (SSE) or whole responses,
// tool-call parsing, metrics, and cancellation when the client goes away.
#include <algorithm>
#include <atomic>
#include <future>

#include "kestrel/server/api_error.h"
#include "kestrel/server/app.h"
#include "kestrel/server/reply_builder.h"
#include "kestrel/text/reply_parser.h"

namespace kestrel::server {
namespace {

// What a forced reply's content piece says, streamed or not: nothing for the newlines between
// Gemma 3 calls, else the piece from its first non-blank character (a call cut by max_tokens,
// from its <tool_call>).
std::string forced_content(const std::string& text) {
  const size_t start = text.find_first_not_of(" \n");
  return start == std::string::npos ? std::string() : text.substr(start);
}

}  // namespace

void App::watch_connection(Job& job, runtime::GenerateOptions& o, const std::function<bool(const std::string&)>& write,
                           bool& wrote, std::vector<runtime::StepLogprobs>& pending) {
  // An SSE comment, or whitespace before a JSON body: written to learn whether the client is there.
  const std::string heartbeat = job.stream ? ":\n\n" : " ";
  o.on_wait = [&write, heartbeat] { return write(heartbeat); };
  auto last = std::make_shared<Clock::time_point>();
  auto count = std::make_shared<size_t>(0);
  o.on_token = [this, &job, &write, &wrote, &pending, heartbeat, last, count](TokenId, const runtime::StepLogprobs* lp) {
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
    if (alive && !wrote && *count > 1) alive = write(heartbeat);
    wrote = false;
    return alive;
  };
}

runtime::GenerateResult App::generate(const std::vector<TokenId>& prompt, const runtime::GenerateOptions& options,
                                      const runtime::TextCallback& on_text) {
  runtime::GenerateResult result = scheduler_->run(prompt, options, on_text);
  account(result);
  return result;
}

void App::account(const runtime::GenerateResult& result) {
  metrics_.tokens(result.prompt_tokens, result.tokens.size());
  metrics_.prompt_cache(result.cached_tokens);
  metrics_.drafts(result.drafted_tokens, result.accepted_tokens);
  metrics_.grammar_steps(result.grammar_exact_steps, result.grammar_dense_steps);
  RequestRecord& record = current_request();  // the access log's token counts
  record.generated = true;
  record.prompt_tokens += result.prompt_tokens;
  record.cached_tokens += result.cached_tokens;
  record.completion_tokens += result.tokens.size();
}

std::vector<std::vector<runtime::GenerateResult>> App::generate_samples(
    Job& job, const std::function<bool(const std::string&)>& write) {
  std::atomic<bool> cancel{false};
  struct Task {
    size_t prompt, sample;
    runtime::GenerateOptions options;
    std::future<runtime::GenerateResult> result;
  };
  std::vector<Task> tasks;
  for (size_t p = 0; p < job.prompts.size(); ++p) {
    for (size_t k = 0; k < job.best_of; ++k) {
      runtime::GenerateOptions o = job.options;
      o.sampler.seed += k;
      o.on_token = [this, &cancel](TokenId, const runtime::StepLogprobs*) { return !cancel && !stopping_; };
      o.on_wait = [this, &cancel] { return !cancel && !stopping_; };
      tasks.push_back({p, k, std::move(o), {}});
    }
  }
  for (auto& t : tasks) {
    t.result = std::async(std::launch::async, [this, &job, &t] { return scheduler_->run(job.prompts[t.prompt], t.options); });
  }
  std::vector<std::vector<runtime::GenerateResult>> out(job.prompts.size(), std::vector<runtime::GenerateResult>(job.best_of));
  std::exception_ptr error;
  for (auto& t : tasks) {
    // A heartbeat (whitespace before the JSON body) each second: a closed connection cancels all.
    while (t.result.wait_for(std::chrono::seconds(1)) != std::future_status::ready) {
      if (!cancel && !write(" ")) cancel = true;
    }
    try {
      out[t.prompt][t.sample] = t.result.get();
      account(out[t.prompt][t.sample]);
      if (out[t.prompt][t.sample].cancelled) cancel = true;
    } catch (...) {
      error = std::current_exception();
      cancel = true;
    }
  }
  if (error) std::rethrow_exception(error);
  if (cancel) return {};
  return out;
}

namespace {

// Summed logprob of a result's tokens (best_of's ranking).
double total_logprob(const runtime::GenerateResult& r) {
  double sum = 0;
  for (const auto& s : r.logprobs) sum += s.chosen.logprob;
  return sum;
}

// The n results of highest summed logprob among best_of, in that order (all of them, in sample
// order, when n == best_of).
std::vector<const runtime::GenerateResult*> best(const std::vector<runtime::GenerateResult>& samples, size_t n) {
  std::vector<const runtime::GenerateResult*> order;
  for (const auto& s : samples) order.push_back(&s);
  if (n < samples.size()) {
    std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) { return total_logprob(*a) > total_logprob(*b); });
    order.resize(n);
  }
  return order;
}

}  // namespace

void App::cut_short() const {
  // A client that went away reads nothing more; one cut by the server's shutdown gets an error
  // (run_job writes it) instead of a stream that just ends, so it knows the answer is incomplete.
  if (stopping_) throw Error("the server is stopping; the answer was cut short");
}

void App::run_job(Job& job, httplib::DataSink& sink) {
  bool alive = true;
  std::function<bool(const std::string&)> write = [&](const std::string& s) {
    // (an empty chunk would end the chunked body: only probe the state then)
    if (alive && !s.empty() && !sink.write(s.data(), s.size())) alive = false;
    return alive;
  };
  try {
    if (job.wire == Wire::kResponses) {
      run_responses(job, write);
    } else if (job.wire == Wire::kMessages) {
      run_messages(job, write);
    } else if (job.endpoint == Endpoint::kChat) {
      run_chat(job, write);
    } else {
      run_completion(job, write);
    }
  } catch (const std::exception& e) {
    const std::string message = std::string("generation failed: ") + e.what();
    if (job.wire == Wire::kMessages) {
      const json err = anthropic_error(500, message);
      write(job.stream ? sse_named_event("error", err) : dump(err));
    } else if (job.wire == Wire::kResponses && job.stream) {
      write(sse_named_event("error", {{"type", "error"}, {"code", "server_error"}, {"message", message}, {"param", nullptr}}));
    } else {
      const json err = ApiError::error_body(message, "server_error", "", "");
      write(job.stream ? sse_event(err) : dump(err));
    }
  }
  if (!alive) metrics_.cancelled();
  metrics_.request_latency(seconds_since(job.arrival));
}

void App::run_chat(Job& job, const std::function<bool(const std::string&)>& write) {
  const text::Tokenizer& tok = engine_->tokenizer();
  if (job.n > 1) {  // not streamed (request.cpp): n samples at once
    const auto samples = generate_samples(job, write);
    if (samples.empty()) return cut_short();
    json choices = json::array();
    size_t completion = 0;
    for (size_t k = 0; k < samples[0].size(); ++k) {
      choices.push_back(chat_choice(job, samples[0][k], k));
      completion += samples[0][k].tokens.size();
    }
    // The prompt is counted once (OpenAI's usage), its cached tokens as the first sample found them.
    const json usage = usage_json(samples[0][0].prompt_tokens, completion, samples[0][0].cached_tokens);
    write(dump({{"id", job.meta.id}, {"object", "chat.completion"}, {"created", job.meta.created},
                {"model", job.meta.model}, {"system_fingerprint", "kestrel-" KESTREL_VERSION},
                {"choices", choices}, {"usage", usage}}));
    return;
  }
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
      if (job.chat.forced_tools && e.kind == text::ReplyEvent::Kind::kContent) {
        e.text = forced_content(e.text);
        if (e.text.empty()) continue;
      }
      json delta;
      if (e.kind == text::ReplyEvent::Kind::kContent) {
        delta = {{"content", e.text}};
      } else if (e.kind == text::ReplyEvent::Kind::kReasoning) {
        delta = {{"reasoning_content", e.text}};
      } else {
        if (n_tool_calls >= job.chat.max_tool_calls) continue;  // parallel_tool_calls not set
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
  watch_connection(job, o, write, wrote, pending);
  if (job.stream) {
    write(sse_event(chat_chunk(job.meta, {{"role", "assistant"}, {"content", ""}}, "", nullptr, job.include_usage)));
  }
  runtime::TextCallback on_text = [&](std::string_view piece) {
    if (job.stream) send_events(parser.feed(piece));
    return write("");
  };
  runtime::GenerateResult result = generate(job.prompts[0], o, on_text);
  if (result.cancelled) return cut_short();
  const json usage = usage_json(result.prompt_tokens, result.tokens.size(), result.cached_tokens,
                                result.drafted_tokens, result.accepted_tokens);
  if (job.stream) {
    send_events(parser.finish());
    // An answer cut by max_tokens says "length", tool calls or not (OpenAI's behaviour).
    const std::string finish = n_tool_calls > 0 && result.finish_reason != "length" ? "tool_calls" : result.finish_reason;
    write(sse_event(chat_chunk(job.meta, json::object(), finish, logprobs_json(), job.include_usage)));
    if (job.include_usage) write(sse_event(usage_chunk(job.meta, "chat.completion.chunk", usage)));
    write(sse_done());
    return;
  }
  json choice = chat_choice(job, result, 0);
  write(dump({{"id", job.meta.id},
              {"object", "chat.completion"},
              {"created", job.meta.created},
              {"model", job.meta.model},
              {"system_fingerprint", "kestrel-" KESTREL_VERSION},
              {"choices", json::array({choice})},
              {"usage", usage}}));
}

json App::chat_choice(const Job& job, const runtime::GenerateResult& result, size_t index) {
  const text::Tokenizer& tok = engine_->tokenizer();
  std::string content, reasoning;
  json tool_calls = json::array();
  for (auto& e : text::parse_reply(job.chat.reply_format, job.chat.parse_tools, result.text)) {
    if (e.kind == text::ReplyEvent::Kind::kContent) content += job.chat.forced_tools ? forced_content(e.text) : e.text;
    if (e.kind == text::ReplyEvent::Kind::kReasoning) reasoning += e.text;
    if (e.kind == text::ReplyEvent::Kind::kToolCall && tool_calls.size() < job.chat.max_tool_calls) {
      tool_calls.push_back({{"id", random_id("call_")},
                            {"type", "function"},
                            {"function", {{"name", e.call.name}, {"arguments", dump(e.call.arguments)}}}});
    }
  }
  json message = {{"role", "assistant"}, {"content", content.empty() && !tool_calls.empty() ? json(nullptr) : json(content)}};
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) message["tool_calls"] = tool_calls;
  return {{"index", index},
          {"message", message},
          {"logprobs", job.top_logprobs >= 0 ? chat_logprobs(tok, result.logprobs) : json(nullptr)},
          {"finish_reason", tool_calls.empty() || result.finish_reason == "length" ? result.finish_reason
                                                                                    : "tool_calls"}};
}

void App::run_completion(Job& job, const std::function<bool(const std::string&)>& write) {
  const text::Tokenizer& tok = engine_->tokenizer();
  if (!job.stream && (job.best_of > 1 || job.prompts.size() > 1)) {
    // Every prompt and sample at once: they decode as one batch.
    const auto samples = generate_samples(job, write);
    if (samples.empty()) return cut_short();
    json choices = json::array();
    size_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      prompt_tokens += samples[i][0].prompt_tokens;
      cached_tokens += samples[i][0].cached_tokens;
      for (const auto& s : samples[i]) completion_tokens += s.tokens.size();
      const auto chosen = best(samples[i], job.n);
      for (size_t k = 0; k < chosen.size(); ++k) {
        const runtime::GenerateResult& result = *chosen[k];
        json lp = nullptr;
        if (job.user_logprobs) {
          lp = job.echo ? echo_completion_logprobs(tok, job.prompts[i], result.prompt_logprobs, result.logprobs)
                        : completion_logprobs(tok, result.logprobs, 0);
        }
        json choice = completion_choice(i * job.n + k, job.echo ? job.prompt_texts[i] + result.text : result.text,
                                        result.finish_reason, lp);
        if (job.prompt_logprobs >= 0) {
          choice["prompt_logprobs"] = vllm_prompt_logprobs(tok, result.prompt_logprobs, result.prompt_ranks);
        }
        choices.push_back(std::move(choice));
      }
    }
    write(dump(completion_object(job.meta, choices, usage_json(prompt_tokens, completion_tokens, cached_tokens))));
    return;
  }
  size_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0, drafted_tokens = 0, accepted_tokens = 0;
  json choices = json::array();
  for (size_t i = 0; i < job.prompts.size(); ++i) {
    std::vector<runtime::StepLogprobs> pending;
    bool wrote = true;
    size_t offset = 0;
    auto o = job.options;
    watch_connection(job, o, write, wrote, pending);
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
    runtime::GenerateResult result = generate(job.prompts[i], o, on_text);
    if (result.cancelled) return cut_short();
    prompt_tokens += result.prompt_tokens;
    cached_tokens += result.cached_tokens;
    completion_tokens += result.tokens.size();
    drafted_tokens += result.drafted_tokens;
    accepted_tokens += result.accepted_tokens;
    if (job.stream) {
      json lp = job.top_logprobs >= 0 && !pending.empty() ? completion_logprobs(tok, pending, offset) : json(nullptr);
      json chunk = completion_object(job.meta, json::array({completion_choice(i, "", result.finish_reason, lp)}), nullptr);
      if (job.include_usage) chunk["usage"] = nullptr;
      write(sse_event(chunk));
    } else {
      json lp = nullptr;
      if (job.top_logprobs >= 0) {
        lp = job.echo ? echo_completion_logprobs(tok, job.prompts[i], result.prompt_logprobs, result.logprobs)
                      : completion_logprobs(tok, result.logprobs, 0);
      }
      json choice = completion_choice(i, job.echo ? job.prompt_texts[i] + result.text : result.text,
                                      result.finish_reason, lp);
      if (job.prompt_logprobs >= 0) choice["prompt_logprobs"] = vllm_prompt_logprobs(tok, result.prompt_logprobs,
                                                                                     result.prompt_ranks);
      choices.push_back(std::move(choice));
    }
  }
  const json usage = usage_json(prompt_tokens, completion_tokens, cached_tokens, drafted_tokens, accepted_tokens);
  if (job.stream) {
    if (job.include_usage) write(sse_event(usage_chunk(job.meta, "text_completion", usage)));
    write(sse_done());
  } else {
    write(dump(completion_object(job.meta, choices, usage)));
  }
}


}  // namespace kestrel::server
