// From a chat request to prompt text: choosing the chat template and how the reply is parsed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kestrel/server/request.h"
#include "kestrel/text/reply_parser.h"
#include "kestrel/text/tokenizer.h"

namespace kestrel::server {

enum class ChatTemplate { kGemma3, kGemma4 };

/// Gemma 4 when the vocabulary has Gemma 4's turn token "<|turn>", else Gemma 3's turn format.
/// A base model without tokenizer.chat_template (the default model) is a Gemma 3 model and gets
/// Gemma 3's format too (docs/serving.md#chat-templates).
ChatTemplate detect_chat_template(const text::Tokenizer& tokenizer);

struct ChatPrompt {
  std::string text;                      // encode with parse_special, without add_special
  text::ReplyFormat reply_format = text::ReplyFormat::kGemma3;
  bool parse_tools = false;              // tools were offered: parse calls out of the reply
  bool render_special = false;           // decode control tokens (Gemma 4's markers)
  bool forced_tools = false;             // tool_choice required/named: only calls (and "\n" between them)
  std::vector<std::string> stop_pieces;  // vocabulary pieces that end the reply
  /// Tool calls the reply may return: 1, or any number with parallel_tool_calls: true (and no
  /// named tool_choice). Calls the model writes beyond it are dropped (tool_choice auto).
  size_t max_tool_calls = 1;
};

/// Renders the request's messages and tools. A json_object response format and a required or
/// named tool_choice also become one instruction line in the system text (both are enforced
/// while sampling too: the server compiles a grammar for them, tool_grammar.h).
/// Throws ApiError 400 when the template refuses the conversation (roles out of order).
ChatPrompt build_chat_prompt(ChatTemplate chat_template, const GenerationRequest& request);

}  // namespace kestrel::server
