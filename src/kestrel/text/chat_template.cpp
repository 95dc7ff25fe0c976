#include "kestrel/text/chat_template.h"

#include "kestrel/base/error.h"

namespace kestrel::text {
namespace {

// Jinja's `trim`: strips leading and trailing whitespace.
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

std::string render_gemma3(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out = "<bos>";
  size_t first = 0;
  std::string system_prefix;
  if (!messages.empty() && messages[0].role == "system") {
    system_prefix = messages[0].content + "\n\n";
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const bool expect_user = (i - first) % 2 == 0;
    std::string role;
    if (m.role == "user") {
      role = "user";
    } else if (m.role == "assistant" || m.role == "model") {
      role = "model";
    } else if (m.role == "system") {
      throw Error("chat: a system message may only come first");
    } else {
      throw Error("chat: unknown role '" + m.role + "' (expected system, user or assistant)");
    }
    if ((role == "user") != expect_user) {
      throw Error("chat: conversation roles must alternate user/assistant/user/assistant/... "
                  "(message " + std::to_string(i) + " is '" + m.role + "')");
    }
    out += "<start_of_turn>" + role + "\n" + (i == first ? system_prefix : "") + trim(m.content) +
           "<end_of_turn>\n";
  }
  // A system message and no user turn to fold it into: Google's template (a prefix of the first
  // user turn) drops it, and so does llama.cpp's; it becomes the user turn here instead, so that
  // the instruction is not lost silently.
  if (first == 1 && messages.size() == 1 && !trim(messages[0].content).empty()) {
    out += "<start_of_turn>user\n" + trim(messages[0].content) + "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace kestrel::text
