#include "kestrel/server/reply_builder.h"

#include "kestrel/server/openai_format.h"

namespace kestrel::server {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string sse_named_event(const std::string& name, const json& data) {
  return "event: " + name + "\ndata: " + dump(data) + "\n\n";
}

// --- Responses ------------------------------------------------------------------------------

void ResponsesBuilder::event(const std::string& type, json data) {
  if (!write_) return;
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  write_(sse_named_event(type, data));
}

json ResponsesBuilder::response(const std::string& status) const {
  json r = base_;
  r["object"] = "response";
  r["status"] = status;
  r["output"] = status == "in_progress" ? json::array() : output_;
  r["error"] = nullptr;
  r["incomplete_details"] = nullptr;
  r["usage"] = nullptr;
  return r;
}

void ResponsesBuilder::start() {
  event("response.created", {{"response", response("in_progress")}});
  event("response.in_progress", {{"response", response("in_progress")}});
}

void ResponsesBuilder::text(const std::string& delta) {
  if (delta.empty()) return;
  if (!in_message_) {
    in_message_ = true;
    message_id_ = "msg_" + base_.value("id", std::string()).substr(5) + std::to_string(output_.size());
    text_.clear();
    event("response.output_item.added",
          {{"output_index", output_.size()},
           {"item", {{"type", "message"}, {"id", message_id_}, {"status", "in_progress"}, {"role", "assistant"},
                     {"content", json::array()}}}});
    event("response.content_part.added", {{"item_id", message_id_}, {"output_index", output_.size()}, {"content_index", 0},
                                          {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
  }
  text_ += delta;
  all_text_ += delta;
  event("response.output_text.delta",
        {{"item_id", message_id_}, {"output_index", output_.size()}, {"content_index", 0}, {"delta", delta},
         {"logprobs", json::array()}});
}

void ResponsesBuilder::close_message() {
  if (!in_message_) return;
  in_message_ = false;
  const json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}, {"logprobs", json::array()}};
  const json item = {{"type", "message"}, {"id", message_id_}, {"status", "completed"}, {"role", "assistant"},
                     {"content", json::array({part})}};
  event("response.output_text.done", {{"item_id", message_id_}, {"output_index", output_.size()}, {"content_index", 0},
                                      {"text", text_}, {"logprobs", json::array()}});
  event("response.content_part.done",
        {{"item_id", message_id_}, {"output_index", output_.size()}, {"content_index", 0}, {"part", part}});
  event("response.output_item.done", {{"output_index", output_.size()}, {"item", item}});
  output_.push_back(item);
}

void ResponsesBuilder::tool_call(const text::ToolCall& call, const std::string& call_id) {
  close_message();
  const std::string item_id = "fc_" + call_id.substr(call_id.find('_') + 1);
  const std::string arguments = dump(call.arguments);
  json item = {{"type", "function_call"}, {"id", item_id}, {"call_id", call_id}, {"name", call.name},
               {"arguments", ""}, {"status", "in_progress"}};
  event("response.output_item.added", {{"output_index", output_.size()}, {"item", item}});
  event("response.function_call_arguments.delta",
        {{"item_id", item_id}, {"output_index", output_.size()}, {"delta", arguments}});
  event("response.function_call_arguments.done",
        {{"item_id", item_id}, {"output_index", output_.size()}, {"name", call.name}, {"arguments", arguments}});
  item["arguments"] = arguments;
  item["status"] = "completed";
  event("response.output_item.done", {{"output_index", output_.size()}, {"item", item}});
  output_.push_back(item);
  calls_.push_back({{"id", call_id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", arguments}}}});
}

json ResponsesBuilder::finish(const std::string& finish_reason, const ReplyUsage& usage) {
  close_message();
  const bool cut = finish_reason == "length";
  json r = response(cut ? "incomplete" : "completed");
  if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["usage"] = {{"input_tokens", usage.input_tokens},
                {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
                {"output_tokens", usage.output_tokens},
                {"output_tokens_details", {{"reasoning_tokens", 0}}},
                {"total_tokens", usage.input_tokens + usage.output_tokens}};
  r["output_text"] = all_text_;  // as the openai SDK's Response.output_text would join them
  return r;
}

void ResponsesBuilder::send_final(const json& response) {
  event(response.value("status", std::string()) == "incomplete" ? "response.incomplete" : "response.completed",
        {{"response", response}});
}

ojson ResponsesBuilder::as_chat_message() const {
  ojson m = {{"role", "assistant"}, {"content", all_text_.empty() && !calls_.empty() ? ojson(nullptr) : ojson(all_text_)}};
  if (!calls_.empty()) m["tool_calls"] = calls_;
  return m;
}

// --- Anthropic Messages ---------------------------------------------------------------------

void MessagesBuilder::event(const std::string& type, json data) {
  if (!write_) return;
  data["type"] = type;
  write_(sse_named_event(type, data));
}

void MessagesBuilder::start(const ReplyUsage& usage) {
  event("message_start", {{"message", {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_},
                                       {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                                       {"usage", {{"input_tokens", usage.input_tokens}, {"output_tokens", 0},
                                                  {"cache_read_input_tokens", usage.cached_tokens},
                                                  {"cache_creation_input_tokens", 0}}}}}});
  event("ping", json::object());
}

void MessagesBuilder::text(const std::string& delta) {
  if (delta.empty()) return;
  if (!in_text_) {
    in_text_ = true;
    content_.push_back({{"type", "text"}, {"text", ""}});
    event("content_block_start", {{"index", content_.size() - 1}, {"content_block", {{"type", "text"}, {"text", ""}}}});
  }
  content_.back()["text"] = content_.back()["text"].get<std::string>() + delta;
  event("content_block_delta", {{"index", content_.size() - 1}, {"delta", {{"type", "text_delta"}, {"text", delta}}}});
}

void MessagesBuilder::close_block() {
  if (!in_text_) return;
  in_text_ = false;
  event("content_block_stop", {{"index", content_.size() - 1}});
}

void MessagesBuilder::tool_use(const text::ToolCall& call, const std::string& id) {
  close_block();
  const json input = call.arguments.is_object() ? call.arguments : json::object();
  content_.push_back({{"type", "tool_use"}, {"id", id}, {"name", call.name}, {"input", input}});
  const size_t index = content_.size() - 1;
  event("content_block_start", {{"index", index},
                                {"content_block", {{"type", "tool_use"}, {"id", id}, {"name", call.name},
                                                   {"input", json::object()}}}});
  event("content_block_delta", {{"index", index}, {"delta", {{"type", "input_json_delta"}, {"partial_json", dump(input)}}}});
  event("content_block_stop", {{"index", index}});
}

json MessagesBuilder::finish(const std::string& stop_reason, const std::string& stop_sequence, const ReplyUsage& usage) {
  close_block();
  const json seq = stop_sequence.empty() ? json(nullptr) : json(stop_sequence);
  event("message_delta", {{"delta", {{"stop_reason", stop_reason}, {"stop_sequence", seq}}},
                          {"usage", {{"output_tokens", usage.output_tokens}}}});
  event("message_stop", json::object());
  return {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_},
          {"content", content_},
          {"stop_reason", stop_reason},
          {"stop_sequence", seq},
          {"usage", {{"input_tokens", usage.input_tokens}, {"output_tokens", usage.output_tokens},
                     {"cache_read_input_tokens", usage.cached_tokens}, {"cache_creation_input_tokens", 0}}}};
}

}  // namespace kestrel::server
