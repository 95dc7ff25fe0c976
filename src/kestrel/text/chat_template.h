// Chat templates: turning a conversation into the prompt text the model was trained on.
#pragma once

#include <string>
#include <vector>

namespace kestrel::text {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant" ("model" is accepted for "assistant")
  std::string content;
};

/// Gemma 3's template (the chat_template of google/gemma-3-*-it tokenizer_config.json):
///   <bos><start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n<start_of_turn>model\n...
/// A leading system message is folded into the first user turn; content is trimmed; the
/// assistant role is written "model". With add_generation_prompt the text ends with
/// "<start_of_turn>model\n". Encode the result with parse_special and without add_special
/// (the text carries its own <bos>).
/// Throws kestrel::Error when roles do not alternate user/assistant starting with user, when
/// a system message is not first, or for an unknown role.
std::string render_gemma3(const std::vector<ChatMessage>& messages, bool add_generation_prompt);

}  // namespace kestrel::text
