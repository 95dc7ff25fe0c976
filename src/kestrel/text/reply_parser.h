// Splits a model's reply, as it streams, into content, thinking and tool calls.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kestrel/text/chat_tools.h"

namespace kestrel::text {

/// How the model writes tool calls and thinking.
///  kGemma3: <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Kestrel's prompt format).
///  kGemma4: <|tool_call>call:NAME{key:value}<tool_call|> and <|channel>thought\n...<channel|>
///           (the text must be decoded with control tokens rendered).
enum class ReplyFormat { kGemma3, kGemma4 };

struct ReplyEvent {
  enum class Kind { kContent, kReasoning, kToolCall };
  Kind kind = Kind::kContent;
  std::string text;  // kContent, kReasoning
  ToolCall call;     // kToolCall: name and arguments (a JSON object); id left empty
};

/// Incremental parser: feed() text as it is generated, finish() at the end. Text that may be
/// the start of a marker is held back until it is known not to be one, so that no marker ever
/// leaks into content. A call whose body does not parse is returned as content, verbatim, so
/// that every kToolCall carries valid JSON arguments.
class ReplyParser {
 public:
  ReplyParser(ReplyFormat format, bool parse_tools);
  std::vector<ReplyEvent> feed(std::string_view text);
  std::vector<ReplyEvent> finish();

 private:
  enum class State { kText, kTool, kThink };
  void drain(std::vector<ReplyEvent>& out, bool final);
  void emit(std::vector<ReplyEvent>& out, ReplyEvent::Kind kind, std::string text);
  bool parse_call(std::string_view body, ToolCall& call) const;

  ReplyFormat format_;
  bool parse_tools_;
  std::string tool_open_, tool_close_, think_open_, think_close_;
  State state_ = State::kText;
  bool think_started_ = false;  // the "thought\n" label after <|channel> was consumed
  std::string buffer_;
};

/// Parses a whole reply at once (non-streaming); consecutive pieces of one kind are merged.
std::vector<ReplyEvent> parse_reply(ReplyFormat format, bool parse_tools, std::string_view text);

}  // namespace kestrel::text
