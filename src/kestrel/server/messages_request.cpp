#include "kestrel/server/messages_request.h"

#include <unordered_map>

#include "kestrel/server/api_error.h"
#include "kestrel/server/json_fields.h"

namespace kestrel::server {
namespace {

using ojson = nlohmann::ordered_json;
using namespace json_fields;  // get, wrong, string_field, string_or, for_each_object

// Text of a string or of text blocks.
std::string text_of(const ojson& content, const std::string& where) {
  return json_fields::content_text(content, where, {"text"}, "only text blocks are supported here");
}

void add_message(const ojson& m, const std::string& where, ojson& messages, std::unordered_map<std::string, std::string>& names) {
  const ojson* role = get(m, "role");
  if (!role || !role->is_string() || (*role != "user" && *role != "assistant")) {
    throw bad_request("'" + where + ".role' must be user or assistant", where + ".role");
  }
  const ojson* content = get(m, "content");
  if (!content) throw bad_request("'" + where + ".content' is required", where + ".content");
  if (content->is_string()) {
    messages.push_back({{"role", *role}, {"content", *content}});
    return;
  }
  std::string text;
  ojson calls = ojson::array();
  ojson results = ojson::array();
  for_each_object(*content, where + ".content", "a string or an array of content blocks",
                  [&](const ojson& block, const std::string& at) {
    const std::string type = string_or(block, "type", at, "");
    if (type == "text") {
      text += string_field(block, "text", at).get<std::string>();
    } else if (type == "tool_use" && *role == "assistant") {
      const ojson& id = string_field(block, "id", at);
      const ojson& name = string_field(block, "name", at);
      const ojson* input = get(block, "input");
      if (input && !input->is_object()) wrong(at + ".input", "an object", *input);
      names[id.get<std::string>()] = name.get<std::string>();
      calls.push_back({{"id", id}, {"type", "function"},
                       {"function", {{"name", name}, {"arguments", input ? *input : ojson::object()}}}});
    } else if (type == "tool_result" && *role == "user") {
      const ojson& id = string_field(block, "tool_use_id", at);
      const ojson* c = get(block, "content");
      std::string out = c ? text_of(*c, at + ".content") : "";
      if (const ojson* e = get(block, "is_error"); e && *e == true) out = "Error: " + out;
      ojson msg = {{"role", "tool"}, {"tool_call_id", id}, {"content", out}};
      if (auto n = names.find(id.get<std::string>()); n != names.end()) msg["name"] = n->second;
      results.push_back(std::move(msg));
    } else if (type != "thinking" && type != "redacted_thinking") {
      throw bad_request("'" + at + ".type' '" + type + "' is not supported in a " + role->get<std::string>() +
                            " message (text, tool_use in assistant turns, tool_result in user turns)",
                        at + ".type");
    }
  });
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
  if (!list) throw bad_request("'messages' is required", "messages");
  if (list->is_array() && list->empty()) throw bad_request("'messages' must hold at least one message", "messages");
  std::unordered_map<std::string, std::string> names;
  for_each_object(*list, "messages", "an array", [&](const ojson& m, const std::string& at) {
    add_message(m, at, messages, names);
  });
  chat["messages"] = messages;
  const ojson* max_tokens = get(body, "max_tokens");
  if (!max_tokens && !count_only) throw bad_request("'max_tokens' is required", "max_tokens");
  if (max_tokens && !count_only) chat["max_tokens"] = *max_tokens;
  for (const char* key : {"temperature", "top_p", "top_k", "stream"}) {
    if (const ojson* v = get(body, key)) chat[key] = *v;
  }
  if (const ojson* stops = get(body, "stop_sequences")) {
    if (!stops->is_array()) wrong("stop_sequences", "an array of strings", *stops);
    for (const auto& stop : *stops) {
      if (!stop.is_string()) wrong("stop_sequences[]", "a string", stop);
      out.stop_sequences.push_back(stop.get<std::string>());
    }
    if (!stops->empty()) chat["stop"] = *stops;
  }
  if (const ojson* tools = get(body, "tools")) {
    ojson chat_tools = ojson::array();
    for_each_object(*tools, "tools", "an array", [&](const ojson& t, const std::string& where) {
      const std::string type = string_or(t, "type", where, "custom");
      if (type != "custom") {
        throw bad_request("'" + where + ".type' '" + type + "' is not supported (client tools with input_schema only)",
                          where + ".type");
      }
      ojson fn = {{"name", string_field(t, "name", where)}};
      if (const ojson* d = get(t, "description")) fn["description"] = *d;
      if (const ojson* sc = get(t, "input_schema")) fn["parameters"] = *sc;
      chat_tools.push_back({{"type", "function"}, {"function", fn}});
    });
    chat["tools"] = chat_tools;
  }
  if (const ojson* choice = get(body, "tool_choice")) {
    if (!choice->is_object()) wrong("tool_choice", "an object", *choice);
    const std::string type = string_or(*choice, "type", "tool_choice", "");
    if (type == "auto") {
      chat["tool_choice"] = "auto";
    } else if (type == "any") {
      chat["tool_choice"] = "required";
    } else if (type == "none") {
      chat["tool_choice"] = "none";
    } else if (type == "tool") {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", string_field(*choice, "name", "tool_choice")}}}};
    } else {
      throw bad_request("'tool_choice.type' must be auto, any, tool or none", "tool_choice.type");
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
