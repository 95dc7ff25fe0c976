// The Responses API's and Anthropic Messages' answers, built from the same reply events the
// chat completions path parses (content, tool calls), streamed as their typed SSE events or
// returned whole. One builder per wire format; both keep the output items they wrote.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "kestrel/text/chat_tools.h"

namespace kestrel::server {

/// Writes one piece of the response body; false when the client went away.
using WriteFn = std::function<bool(const std::string&)>;

/// An SSE event with a name: "event: NAME\ndata: {json}\n\n".
std::string sse_named_event(const std::string& name, const nlohmann::json& data);

/// Token counts of a finished reply.
struct ReplyUsage {
  size_t input_tokens = 0, cached_tokens = 0, output_tokens = 0;
};

/// OpenAI's Responses API: output items "message" (output_text) and "function_call"; events
/// response.created, response.in_progress, response.output_item.added / .done,
/// response.content_part.added / .done, response.output_text.delta / .done,
/// response.function_call_arguments.delta / .done, response.completed (or
/// response.incomplete, cut by max_output_tokens). Each event carries type and sequence_number.
class ResponsesBuilder {
 public:
  /// `base`: the response object's fixed fields (id, created_at, model, and the request's
  /// instructions, tools, tool_choice, text, ...). write is null when not streaming.
  ResponsesBuilder(nlohmann::json base, WriteFn write) : base_(std::move(base)), write_(std::move(write)) {}
  void start();
  void text(const std::string& delta);
  void tool_call(const text::ToolCall& call, const std::string& call_id);
  /// Ends the reply: finish_reason "length" makes the response incomplete (max_output_tokens).
  /// Returns the final response object (the body when not streaming); send_final(it) then
  /// writes the stream's last event (response.completed or response.incomplete).
  nlohmann::json finish(const std::string& finish_reason, const ReplyUsage& usage);
  void send_final(const nlohmann::json& response);
  /// The assistant's turn as chat messages (for previous_response_id): content and tool calls.
  nlohmann::ordered_json as_chat_message() const;

 private:
  void event(const std::string& type, nlohmann::json data);
  void close_message();
  nlohmann::json response(const std::string& status) const;

  nlohmann::json base_;
  WriteFn write_;
  nlohmann::json output_ = nlohmann::json::array();
  bool in_message_ = false;
  std::string message_id_, text_, all_text_;
  nlohmann::ordered_json calls_ = nlohmann::ordered_json::array();
  size_t sequence_ = 0;
};

/// Anthropic's Messages API: content blocks "text" and "tool_use"; events message_start,
/// content_block_start / _delta (text_delta, input_json_delta) / _stop, message_delta (stop
/// reason, output tokens), message_stop; a ping after message_start.
class MessagesBuilder {
 public:
  /// `id` "msg_…", `model` as the request named it. write is null when not streaming.
  MessagesBuilder(std::string id, std::string model, WriteFn write)
      : id_(std::move(id)), model_(std::move(model)), write_(std::move(write)) {}
  void start(const ReplyUsage& usage);
  void text(const std::string& delta);
  void tool_use(const text::ToolCall& call, const std::string& id);
  /// stop_reason: end_turn, max_tokens, stop_sequence (with the sequence), tool_use. Returns
  /// the message object (the body when not streaming).
  nlohmann::json finish(const std::string& stop_reason, const std::string& stop_sequence, const ReplyUsage& usage);

 private:
  void event(const std::string& type, nlohmann::json data);
  void close_block();

  std::string id_, model_;
  WriteFn write_;
  nlohmann::json content_ = nlohmann::json::array();
  bool in_text_ = false;
};

}  // namespace kestrel::server
