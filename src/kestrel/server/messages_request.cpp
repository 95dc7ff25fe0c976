#include "kestrel/server/messages_request.h"

#include <unordered_map>

#include "kestrel/server/api_error.h"
#include "kestrel/server/json_fields.h"

namespace kestrel::server {
namespace {

using ojson = nlohmann::ordered_json;

using json_fields::get;
using json_fields::kind;

[[noreturn]] void wrong(const std::string& where, const char* expected, const ojson& v) {
  throw bad_request(where + ": must be " + expected + ", got " + kind(v), where);
}

// Text of a string or of text blocks.
std::string text_of(const ojson& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) wrong(where, "a string or an array of content blocks", content);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& block = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!block.is_object()) wrong(at, "an object", block);
    if (block.value("type", std::string()) != "text") {
      throw bad_request(at + ".type: only text blocks are supported here", at + ".type");
    }
    const ojson* text = get(block, "text");
    if (!text || !text->is_string()) throw bad_request(at + ".text: must be a string", at + ".text");
    out += text->get<std::string>();
  }
  return out;
}

void add_message(const ojson& m, const std::string& where, ojson& messages, std::unordered_map<std::string, std::string>& names) {
  if (!m.is_object()) wrong(where, "an object", m);
  const ojson* role = get(m, "role");
  if (!role || !role->is_string() || (*role != "user" && *role != "assistant")) {
    throw bad_request(where + ".role: must be user or assistant", where + ".role");
  }
  const ojson* content = get(m, "content");
  if (!content) throw bad_request(where + ".content: is required", where + ".content");
  if (content->is_string()) {
    messages.push_back({{"role", *role}, {"content", *content}});
    return;
  }
  if (!content->is_array()) wrong(where + ".content", "a string or an array of content blocks", *content);
  std::string text;
  ojson calls = ojson::array();
  ojson results = ojson::array();
  for (size_t i = 0; i < content->size(); ++i) {
    const ojson& block = (*content)[i];
    const std::string at = where + ".content[" + std::to_string(i) + "]";
    if (!block.is_object()) wrong(at, "an object", block);
    const std::string type = block.value("type", std::string());
    if (type == "text") {
      const ojson* t = get(block, "text");
      if (!t || !t->is_string()) throw bad_request(at + ".text: must be a string", at + ".text");
      text += t->get<std::string>();
    } else if (type == "tool_use" && *role == "assistant") {
      const ojson* id = get(block, "id");
      const ojson* name = get(block, "name");
      const ojson* input = get(block, "input");
      if (!id || !id->is_string()) throw bad_request(at + ".id: must be a string", at + ".id");
      if (!name || !name->is_string()) throw bad_request(at + ".name: must be a string", at + ".name");
      if (input && !input->is_object()) wrong(at + ".input", "an object", *input);
      names[id->get<std::string>()] = name->get<std::string>();
      calls.push_back({{"id", *id}, {"type", "function"},
                       {"function", {{"name", *name}, {"arguments", input ? *input : ojson::object()}}}});
    } else if (type == "tool_result" && *role == "user") {
      const ojson* id = get(block, "tool_use_id");
      if (!id || !id->is_string()) throw bad_request(at + ".tool_use_id: must be a string", at + ".tool_use_id");
      const ojson* c = get(block, "content");
      std::string out = c ? text_of(*c, at + ".content") : "";
      if (block.value("is_error", false) == true) out = "Error: " + out;
      ojson msg = {{"role", "tool"}, {"tool_call_id", *id}, {"content", out}};
      if (auto n = names.find(id->get<std::string>()); n != names.end()) msg["name"] = n->second;
      results.push_back(std::move(msg));
    } else if (type == "thinking" || type == "redacted_thinking") {
      continue;
    } else {
      throw bad_request(at + ".type: '" + type + "' is not supported in a " + role->get<std::string>() +
                            " message (text, tool_use in assistant turns, tool_result in user turns)",
                        at + ".type");
    }
  }
  for (auto& r : results) messages.push_back(std::move(r));
  if (*role == "assistant") {
    ojson msg = {{"role", "assistant"}, {"content", text.empty() && !calls.empty() ? ojson(nullptr) : ojson(text)}};
    if (!calls.empty()) msg["tool_calls"] = calls;
    messages.push_back(std::move(msg));
  } else if (!text.empty() || results.empty()) {
    messages.push_back({{"role", "user"}, {"content", text}});
  }
}

}  // namespace

MessagesRequest messages_to_chat(const ojson& body, bool count_only) {
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  MessagesRequest out;
  ojson& chat = out.chat;
  chat = ojson::object();
  if (const ojson* model = get(body, "model")) {
    if (!model->is_string()) wrong("model", "a string", *model);
    out.model = model->get<std::string>();
  }
  ojson messages = ojson::array();
  if (const ojson* system = get(body, "system")) {
    messages.push_back({{"role", "system"}, {"content", text_of(*system, "system")}});
  }
  const ojson* list = get(body, "messages");
  if (!list) throw bad_request("messages: Field required", "messages");
  if (!list->is_array()) wrong("messages", "an array", *list);
  if (list->empty()) throw bad_request("messages: at least one message is required", "messages");
  std::unordered_map<std::string, std::string> names;
  for (size_t i = 0; i < list->size(); ++i) add_message((*list)[i], "messages[" + std::to_string(i) + "]", messages, names);
  chat["messages"] = messages;
  const ojson* max_tokens = get(body, "max_tokens");
  if (!max_tokens && !count_only) throw bad_request("max_tokens: Field required", "max_tokens");
  if (max_tokens && !count_only) chat["max_tokens"] = *max_tokens;
  for (const char* key : {"temperature", "top_p", "top_k", "stream"}) {
    if (const ojson* v = get(body, key)) chat[key] = *v;
  }
  if (const ojson* stops = get(body, "stop_sequences")) {
    if (!stops->is_array()) wrong("stop_sequences", "an array of strings", *stops);
    for (const auto& s : *stops) {
      if (!s.is_string()) wrong("stop_sequences[]", "a string", s);
      out.stop_sequences.push_back(s.get<std::string>());
    }
    if (!stops->empty()) chat["stop"] = *stops;
  }
  if (const ojson* tools = get(body, "tools")) {
    if (!tools->is_array()) wrong("tools", "an array", *tools);
    ojson chat_tools = ojson::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) wrong(where, "an object", t);
      const std::string type = t.value("type", std::string("custom"));
      if (type != "custom") {
        throw bad_request(where + ".type: '" + type + "' is not supported (client tools with input_schema only)",
                          where + ".type");
      }
      const ojson* name = get(t, "name");
      if (!name || !name->is_string()) throw bad_request(where + ".name: must be a string", where + ".name");
      ojson fn = {{"name", *name}};
      if (const ojson* d = get(t, "description")) fn["description"] = *d;
      if (const ojson* s = get(t, "input_schema")) fn["parameters"] = *s;
      chat_tools.push_back({{"type", "function"}, {"function", fn}});
    }
    chat["tools"] = chat_tools;
  }
  if (const ojson* choice = get(body, "tool_choice")) {
    if (!choice->is_object()) wrong("tool_choice", "an object", *choice);
    const std::string type = choice->value("type", std::string());
    if (type == "auto") {
      chat["tool_choice"] = "auto";
    } else if (type == "any") {
      chat["tool_choice"] = "required";
    } else if (type == "none") {
      chat["tool_choice"] = "none";
    } else if (type == "tool") {
      const ojson* name = get(*choice, "name");
      if (!name || !name->is_string()) throw bad_request("tool_choice.name: must be a string", "tool_choice.name");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else {
      throw bad_request("tool_choice.type: must be auto, any, tool or none", "tool_choice.type");
    }
    // Anthropic allows several calls unless disable_parallel_tool_use; Kestrel makes one unless
    // it is false explicitly (docs/serving.md#anthropic-messages).
    if (const ojson* d = get(*choice, "disable_parallel_tool_use"); d && d->is_boolean() && !d->get<bool>()) {
      chat["parallel_tool_calls"] = true;
    }
  }
  return out;
}

nlohmann::json anthropic_error(int status, const std::string& message) {
  std::string type = "api_error";
  if (status == 400 || status == 405 || status == 415) type = "invalid_request_error";
  if (status == 401) type = "authentication_error";
  if (status == 403) type = "permission_error";
  if (status == 404) type = "not_found_error";
  if (status == 413) type = "request_too_large";
  if (status == 429) type = "rate_limit_error";
  if (status == 503 || status == 529) type = "overloaded_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

}  // namespace kestrel::server
