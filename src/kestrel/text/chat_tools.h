// Conversations with tools: the message model shared by the chat templates that render tool
// declarations, tool calls and tool responses (Gemma 4 natively; Gemma 3 through Kestrel's
// documented prompt format, docs/serving.md#tools).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kestrel::text {

/// A function the model may call: OpenAI's tools[].function.
struct ToolDefinition {
  std::string name;
  std::string description;
  nlohmann::json parameters = nlohmann::json::object();  // a JSON Schema object (may be empty)
};

/// One call of a function, as the model wrote it or as the client sends it back.
struct ToolCall {
  std::string id;
  std::string name;
  nlohmann::json arguments = nlohmann::json::object();  // always a JSON object
};

/// One conversation turn. role: system, developer, user, assistant (or model), tool.
struct Message {
  std::string role;
  std::string content;
  std::string reasoning;            // assistant: its thinking (reasoning_content)
  std::vector<ToolCall> tool_calls; // assistant: the calls it made
  std::string tool_call_id;         // tool: the call answered
  std::string name;                 // tool: the function's name, when the client gives it
};

/// Gemma 3 has no tool format of its own. Kestrel's (docs/serving.md#tools): the declarations
/// go into the system text (folded into the first user turn), one JSON object per function;
/// the model answers a call with <tool_call>{"name": ..., "arguments": {...}}</tool_call>;
/// tool results come back as a user turn of <tool_response name="...">...</tool_response>
/// blocks (consecutive tool messages share one turn).
/// Throws kestrel::Error for roles out of order (as render_gemma3) or an unknown role.
std::string render_gemma3_tools(const std::vector<Message>& messages,
                                const std::vector<ToolDefinition>& tools, bool add_generation_prompt);

/// Gemma 4's chat format, written from Google's published Gemma 4 chat template:
///   <bos><|turn>system\n[<|think|>\n]{system}{<|tool>declaration:NAME{...}<tool|>...}<turn|>\n
///   <|turn>user\n{text}<turn|>\n
///   <|turn>model\n[<|channel>thought\n{reasoning}\n<channel|>]{content}
///       <|tool_call>call:NAME{key:value,...}<tool_call|>...<|tool_response>response:NAME{...}<tool_response|>...<turn|>\n
/// Strings inside declarations, calls and responses are delimited by <|"|>; object keys are
/// written bare and sorted. Tool messages that follow an assistant's tool calls are rendered
/// inside that model turn; an assistant message after tool responses continues the same turn.
/// Reasoning is rendered only for assistant turns after the last user message.
/// With add_generation_prompt: "<|turn>model\n" unless the text ends in a tool call/response.
/// Throws kestrel::Error for an unknown role.
std::string render_gemma4(const std::vector<Message>& messages, const std::vector<ToolDefinition>& tools,
                          bool add_generation_prompt, bool enable_thinking);

/// Gemma 4's value syntax: strings as <|"|>text<|"|>, numbers/true/false/null as is, objects
/// {key:value,...} with bare sorted keys (quoted keys when `quote_keys`), arrays [a,b].
std::string gemma4_value(const nlohmann::json& value, bool quote_keys);

/// Parses Gemma 4's value syntax (the inverse of gemma4_value; keys bare or <|"|>-quoted)
/// into JSON. Returns std::nullopt-like discarded json (is_discarded()) on malformed input.
nlohmann::json parse_gemma4_value(std::string_view text);

}  // namespace kestrel::text
