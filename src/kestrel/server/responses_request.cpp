#include "kestrel/server/responses_request.h"

#include <unordered_map>

#include "kestrel/server/api_error.h"
#include "kestrel/server/json_fields.h"

namespace kestrel::server {
namespace {

using ojson = nlohmann::ordered_json;

using json_fields::get;
using json_fields::kind;

[[noreturn]] void wrong(const std::string& where, const char* expected, const ojson& v) {
  throw bad_request("'" + where + "' must be " + expected + ", got " + kind(v), where);
}

// A message's content: a string, or parts of type input_text / output_text / text.
std::string content_text(const ojson& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) wrong(where, "a string or an array of content parts", content);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object()) wrong(at, "an object", part);
    const std::string type = part.value("type", std::string());
    if (type != "input_text" && type != "output_text" && type != "text") {
      throw bad_request("'" + at + ".type' " + (type.empty() ? "is missing" : "'" + type + "' is not supported") +
                            " (input_text, output_text: this server reads text only)", at + ".type");
    }
    const ojson* text = get(part, "text");
    if (!text || !text->is_string()) throw bad_request("'" + at + ".text' must be a string", at + ".text");
    out += text->get<std::string>();
  }
  return out;
}

// Appends the input items as chat messages; function calls of one turn share an assistant message.
void add_items(const ojson& input, ojson& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return;
  }
  if (!input.is_array()) wrong("input", "a string or an array of items", input);
  std::unordered_map<std::string, std::string> call_names;
  for (const auto& m : messages) {
    if (auto tc = m.find("tool_calls"); tc != m.end()) {
      for (const auto& c : *tc) call_names[c.value("id", "")] = c["function"].value("name", "");
    }
  }
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& item = input[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) wrong(where, "an object", item);
    const ojson* type_field = get(item, "type");
    if (type_field && !type_field->is_string()) wrong(where + ".type", "a string", *type_field);
    const std::string type = type_field ? type_field->get<std::string>() : "message";
    if (type == "message") {
      const ojson* role = get(item, "role");
      if (!role || !role->is_string()) throw bad_request("'" + where + ".role' must be a string", where + ".role");
      const std::string r = role->get<std::string>();
      if (r != "user" && r != "assistant" && r != "system" && r != "developer") {
        throw bad_request("'" + where + ".role' must be user, assistant, system or developer", where + ".role");
      }
      const ojson* content = get(item, "content");
      if (!content) throw bad_request("'" + where + ".content' is required", where + ".content");
      messages.push_back({{"role", r}, {"content", content_text(*content, where + ".content")}});
    } else if (type == "function_call") {
      const ojson* name = get(item, "name");
      const ojson* call_id = get(item, "call_id");
      const ojson* args = get(item, "arguments");
      if (!name || !name->is_string()) throw bad_request("'" + where + ".name' must be a string", where + ".name");
      if (!call_id || !call_id->is_string()) throw bad_request("'" + where + ".call_id' must be a string", where + ".call_id");
      if (args && !args->is_string()) wrong(where + ".arguments", "a string (JSON)", *args);
      ojson call = {{"id", *call_id}, {"type", "function"},
                    {"function", {{"name", *name}, {"arguments", args ? args->get<std::string>() : "{}"}}}};
      call_names[call_id->get<std::string>()] = name->get<std::string>();
      if (!messages.empty() && messages.back()["role"] == "assistant" && messages.back().contains("tool_calls")) {
        messages.back()["tool_calls"].push_back(call);
      } else {
        messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array({call})}});
      }
    } else if (type == "function_call_output") {
      const ojson* call_id = get(item, "call_id");
      const ojson* output = get(item, "output");
      if (!call_id || !call_id->is_string()) throw bad_request("'" + where + ".call_id' must be a string", where + ".call_id");
      if (!output) throw bad_request("'" + where + ".output' is required", where + ".output");
      ojson msg = {{"role", "tool"}, {"tool_call_id", *call_id},
                   {"content", output->is_string() ? output->get<std::string>() : content_text(*output, where + ".output")}};
      if (auto n = call_names.find(call_id->get<std::string>()); n != call_names.end()) msg["name"] = n->second;
      messages.push_back(std::move(msg));
    } else if (type == "reasoning") {
      continue;  // a previous turn's reasoning item: not rendered again
    } else {
      throw bad_request("'" + where + ".type' '" + type +
                            "' is not supported (message, function_call, function_call_output)", where + ".type");
    }
  }
}

}  // namespace

void ResponseStore::put(const std::string& id, Entry entry) {
  std::lock_guard lock(mu_);
  if (capacity_ == 0) return;
  order_.push_front(id);
  entries_[id] = {std::move(entry), order_.begin()};
  while (entries_.size() > capacity_) {
    entries_.erase(order_.back());
    order_.pop_back();
  }
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  order_.splice(order_.begin(), order_, it->second.second);
  return it->second.first;
}

ResponsesRequest responses_to_chat(const ojson& body, ResponseStore& store) {
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  ResponsesRequest out;
  ojson& chat = out.chat;
  chat = ojson::object();
  ojson messages = ojson::array();
  if (const ojson* prev = get(body, "previous_response_id")) {
    if (!prev->is_string()) wrong("previous_response_id", "a string", *prev);
    out.previous_response_id = prev->get<std::string>();
    auto entry = store.get(out.previous_response_id);
    if (!entry) {
      throw ApiError(404, "Previous response with id '" + out.previous_response_id +
                              "' not found (never stored, stored with store: false, or evicted: the server keeps the " +
                              std::to_string(store.capacity()) + " most recently used responses, in memory)",
                     "previous_response_id", "previous_response_not_found");
    }
    messages = entry->messages;
  }
  if (const ojson* s = get(body, "store")) {
    if (!s->is_boolean()) wrong("store", "a boolean", *s);
    out.store = s->get<bool>();
  }
  const ojson* input = get(body, "input");
  if (!input) throw bad_request("'input' is required", "input");
  add_items(*input, messages);
  if (messages.empty()) throw bad_request("'input' must not be empty", "input");
  out.history = messages;
  ojson all = ojson::array();
  if (const ojson* instructions = get(body, "instructions")) {
    if (!instructions->is_string()) wrong("instructions", "a string", *instructions);
    all.push_back({{"role", "system"}, {"content", *instructions}});
    out.echo["instructions"] = *instructions;
  } else {
    out.echo["instructions"] = nullptr;
  }
  for (auto& m : messages) all.push_back(m);
  chat["messages"] = std::move(all);
  if (const ojson* model = get(body, "model")) chat["model"] = *model;
  for (const char* key : {"temperature", "top_p", "top_k", "min_p", "seed", "stream", "parallel_tool_calls",
                          "presence_penalty", "frequency_penalty", "cache_prompt"}) {
    if (const ojson* v = get(body, key)) chat[key] = *v;
  }
  if (const ojson* m = get(body, "max_output_tokens")) chat["max_tokens"] = *m;
  if (const ojson* tools = get(body, "tools")) {
    if (!tools->is_array()) wrong("tools", "an array", *tools);
    ojson chat_tools = ojson::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) wrong(where, "an object", t);
      const std::string type = t.value("type", std::string());
      if (type != "function") {
        throw bad_request("'" + where + ".type' '" + type + "' is not supported: this server calls functions only",
                          where + ".type");
      }
      ojson fn = ojson::object();
      for (const char* key : {"name", "description", "parameters"}) {
        if (const ojson* v = get(t, key)) fn[key] = *v;
      }
      chat_tools.push_back({{"type", "function"}, {"function", fn}});
    }
    chat["tools"] = chat_tools;
    out.echo["tools"] = *tools;
  } else {
    out.echo["tools"] = ojson::array();
  }
  if (const ojson* choice = get(body, "tool_choice")) {
    if (choice->is_string()) {
      chat["tool_choice"] = *choice;
    } else if (choice->is_object() && choice->value("type", std::string()) == "function" && get(*choice, "name")) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
    } else {
      throw bad_request("'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}",
                        "tool_choice");
    }
    out.echo["tool_choice"] = *choice;
  } else {
    out.echo["tool_choice"] = "auto";
  }
  ojson format = {{"type", "text"}};
  if (const ojson* text = get(body, "text")) {
    if (!text->is_object()) wrong("text", "an object", *text);
    if (const ojson* f = get(*text, "format")) {
      if (!f->is_object()) wrong("text.format", "an object", *f);
      const std::string type = f->value("type", std::string());
      if (type == "json_schema") {
        const ojson* schema = get(*f, "schema");
        if (!schema || !schema->is_object()) {
          throw bad_request("'text.format.schema' must be a JSON Schema object", "text.format.schema");
        }
        ojson js = {{"name", f->value("name", std::string("response"))}, {"schema", *schema}};
        if (const ojson* strict = get(*f, "strict")) js["strict"] = *strict;
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
      } else if (type == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (type != "text") {
        throw bad_request("'text.format.type' must be text, json_schema or json_object", "text.format.type");
      }
      format = *f;
    }
  }
  out.echo["text"] = {{"format", format}};
  for (const char* key : {"temperature", "top_p", "max_output_tokens", "parallel_tool_calls", "metadata"}) {
    const ojson* v = get(body, key);
    out.echo[key] = v ? *v : ojson(nullptr);
  }
  out.echo["previous_response_id"] = out.previous_response_id.empty() ? ojson(nullptr) : ojson(out.previous_response_id);
  out.echo["store"] = out.store;
  return out;
}

}  // namespace kestrel::server
