#include "kestrel/server/chat_prompt.h"

#include <cstdint>

#include "kestrel/server/api_error.h"
#include "kestrel/text/chat_tools.h"

namespace kestrel::server {

ChatTemplate detect_chat_template(const text::Tokenizer& tokenizer) {
  return tokenizer.find("<|turn>") ? ChatTemplate::kGemma4 : ChatTemplate::kGemma3;
}

ChatPrompt build_chat_prompt(ChatTemplate chat_template, const GenerationRequest& request) {
  std::vector<text::Message> messages = request.messages;
  std::string instruction;
  if (request.json_object) instruction += "Answer with one valid JSON object and nothing else.";
  if (request.tool_choice == "required" && !request.tool_choice_named) {
    instruction += std::string(instruction.empty() ? "" : " ") + "Answer by calling one of the functions.";
  } else if (request.tool_choice != "auto" && request.tool_choice != "none") {
    instruction += std::string(instruction.empty() ? "" : " ") + "Answer by calling the function " +
                   request.tool_choice + ".";
  }
  if (!instruction.empty()) {
    if (!messages.empty() && (messages[0].role == "system" || messages[0].role == "developer")) {
      messages[0].content += "\n\n" + instruction;
    } else {
      messages.insert(messages.begin(), text::Message{"system", instruction, "", {}, "", ""});
    }
  }
  ChatPrompt out;
  out.parse_tools = !request.tools.empty();
  out.forced_tools = out.parse_tools && request.tool_choice != "auto" && request.tool_choice != "none";
  out.max_tool_calls = request.parallel_tool_calls && !request.tool_choice_named ? SIZE_MAX : 1;
  try {
    if (chat_template == ChatTemplate::kGemma4) {
      out.text = text::render_gemma4(messages, request.tools, true, request.enable_thinking);
      out.reply_format = text::ReplyFormat::kGemma4;
      out.render_special = true;
      out.stop_pieces = {"<turn|>"};
      if (out.parse_tools) out.stop_pieces.push_back("<|tool_response>");
    } else {
      out.text = text::render_gemma3_tools(messages, request.tools, true);
      out.reply_format = text::ReplyFormat::kGemma3;
    }
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw bad_request(e.what(), "messages");
  }
  return out;
}

}  // namespace kestrel::server
