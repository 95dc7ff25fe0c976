// Running the Responses API's and Anthropic Messages' requests: the chat path's generation and
// reply parsing, shaped by reply_builder.h.
#include "kestrel/server/app.h"
#include "kestrel/server/reply_builder.h"
#include "kestrel/text/reply_parser.h"

namespace kestrel::server {
namespace {

// As run_chat's forced_content: nothing for the newlines between forced calls.
std::string forced_text(const std::string& text) {
  const size_t start = text.find_first_not_of(" \n");
  return start == std::string::npos ? std::string() : text.substr(start);
}

}  // namespace

runtime::GenerateResult App::run_reply(Job& job, const std::function<bool(const std::string&)>& write,
                                       const std::function<void(const text::ReplyEvent&)>& on_event) {
  text::ReplyParser parser(job.chat.reply_format, job.chat.parse_tools);
  std::vector<runtime::StepLogprobs> pending;
  bool wrote = true;
  size_t n_calls = 0;
  auto deliver = [&](std::vector<text::ReplyEvent> events) {
    for (auto& e : events) {
      if (e.kind == text::ReplyEvent::Kind::kReasoning) continue;
      if (e.kind == text::ReplyEvent::Kind::kContent && job.chat.forced_tools) {
        e.text = forced_text(e.text);
        if (e.text.empty()) continue;
      }
      if (e.kind == text::ReplyEvent::Kind::kToolCall && n_calls++ >= job.chat.max_tool_calls) continue;
      on_event(e);
      wrote = true;
    }
  };
  auto& o = job.options;
  watch_connection(job, o, write, wrote, pending);
  runtime::TextCallback on_text = [&](std::string_view piece) {
    if (job.stream) deliver(parser.feed(piece));
    return write("");
  };
  runtime::GenerateResult result = generate(job.prompts[0], o, on_text);
  if (result.cancelled) return result;
  deliver(job.stream ? parser.finish() : text::parse_reply(job.chat.reply_format, job.chat.parse_tools, result.text));
  return result;
}

void App::run_responses(Job& job, const std::function<bool(const std::string&)>& write) {
  json base = job.responses->echo;
  base["id"] = job.meta.id;
  base["created_at"] = job.meta.created;
  base["model"] = job.meta.model;
  ResponsesBuilder builder(base, job.stream ? write : nullptr);
  builder.start();
  runtime::GenerateResult result = run_reply(job, write, [&](const text::ReplyEvent& e) {
    if (e.kind == text::ReplyEvent::Kind::kToolCall) {
      builder.tool_call(e.call, random_id("call_"));
    } else {
      builder.text(e.text);
    }
  });
  if (result.cancelled) return cut_short();
  const json response =
      builder.finish(result.finish_reason, {result.prompt_tokens, result.cached_tokens, result.tokens.size()});
  // Stored before the client reads the end of the answer, so that a follow-up finds it.
  if (job.responses->store) {
    nlohmann::ordered_json messages = job.responses->history;
    messages.push_back(builder.as_chat_message());
    responses_.put(job.meta.id, {std::move(messages), response});
  }
  if (job.stream) {
    builder.send_final(response);
  } else {
    write(dump(response));
  }
}

void App::run_messages(Job& job, const std::function<bool(const std::string&)>& write) {
  const MessagesRequest& request = *job.messages;
  MessagesBuilder builder(job.meta.id, request.model.empty() ? job.meta.model : request.model,
                          job.stream ? write : nullptr);
  builder.start({job.prompts[0].size(), 0, 0});
  size_t n_calls = 0;
  runtime::GenerateResult result = run_reply(job, write, [&](const text::ReplyEvent& e) {
    if (e.kind == text::ReplyEvent::Kind::kToolCall) {
      ++n_calls;
      builder.tool_use(e.call, random_id("toolu_"));
    } else {
      builder.text(e.text);
    }
  });
  if (result.cancelled) return cut_short();
  std::string stop_reason = "end_turn", stop_sequence;
  if (result.finish_reason == "length") {
    stop_reason = "max_tokens";
  } else if (n_calls > 0) {
    stop_reason = "tool_use";
  } else if (!request.stop_sequences.empty()) {
    // Which stop sequence ended the text: the earliest one in the generated text past the
    // answer (the answer itself stops before it).
    const std::string all = engine_->tokenizer().decode(result.tokens);
    size_t best = std::string::npos;
    for (const auto& s : request.stop_sequences) {
      const size_t at = all.find(s, result.text.size() > 8 ? result.text.size() - 8 : 0);
      if (at != std::string::npos && at < best) {
        best = at;
        stop_sequence = s;
      }
    }
    if (!stop_sequence.empty()) stop_reason = "stop_sequence";
  }
  const json message =
      builder.finish(stop_reason, stop_sequence, {result.prompt_tokens, result.cached_tokens, result.tokens.size()});
  if (!job.stream) write(dump(message));
}

}  // namespace kestrel::server
