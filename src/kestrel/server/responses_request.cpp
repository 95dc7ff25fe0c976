#include "kestrel/server/responses_request.h"

#include <unordered_map>

#include "kestrel/server/api_error.h"
#include "kestrel/server/json_fields.h"

namespace kestrel::server {
namespace {

using ojson = nlohmann::ordered_json;
using namespace json_fields;  // get, wrong, string_field, string_or, for_each_object

// A message's content: a string, or parts of type input_text / output_text / text.
std::string content_text(const ojson& content, const std::string& where) {
  return json_fields::content_text(content, where, {"input_text", "output_text", "text"},
                                   "input_text, output_text: this server reads text only");
}

// Appends the input items as chat messages; function calls of one turn share an assistant message.
void add_items(const ojson& input, ojson& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return;
  }
  std::unordered_map<std::string, std::string> call_names;
  for (const auto& m : messages) {
    if (auto tc = m.find("tool_calls"); tc != m.end()) {
      for (const auto& c : *tc) call_names[c.value("id", "")] = c["function"].value("name", "");
    }
  }
  for_each_object(input, "input", "a string or an array of items", [&](const ojson& item, const std::string& where) {
    const std::string type = string_or(item, "type", where, "message");
    if (type == "message") {
      const std::string r = string_field(item, "role", where).get<std::string>();
      if (r != "user" && r != "assistant" && r != "system" && r != "developer") {
        throw bad_request("'" + where + ".role' must be user, assistant, system or developer", where + ".role");
      }
      const ojson* content = get(item, "content");
      if (!content) throw bad_request("'" + where + ".content' is required", where + ".content");
      messages.push_back({{"role", r}, {"content", content_text(*content, where + ".content")}});
    } else if (type == "function_call") {
      const ojson& name = string_field(item, "name", where);
      const ojson& call_id = string_field(item, "call_id", where);
      const ojson* args = get(item, "arguments");
      if (args && !args->is_string()) wrong(where + ".arguments", "a string (JSON)", *args);
      ojson call = {{"id", call_id}, {"type", "function"},
                    {"function", {{"name", name}, {"arguments", args ? args->get<std::string>() : "{}"}}}};
      call_names[call_id.get<std::string>()] = name.get<std::string>();
      if (!messages.empty() && messages.back()["role"] == "assistant" && messages.back().contains("tool_calls")) {
        messages.back()["tool_calls"].push_back(call);
      } else {
        messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array({call})}});
      }
    } else if (type == "function_call_output") {
      const ojson& call_id = string_field(item, "call_id", where);
      const ojson* output = get(item, "output");
      if (!output) throw bad_request("'" + where + ".output' is required", where + ".output");
      ojson msg = {{"role", "tool"}, {"tool_call_id", call_id},
                   {"content", output->is_string() ? output->get<std::string>() : content_text(*output, where + ".output")}};
      if (auto n = call_names.find(call_id.get<std::string>()); n != call_names.end()) msg["name"] = n->second;
      messages.push_back(std::move(msg));
    } else if (type != "reasoning") {  // a previous turn's reasoning item is not rendered again
      throw bad_request("'" + where + ".type' '" + type +
                            "' is not supported (message, function_call, function_call_output)", where + ".type");
    }
  });
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
    ojson chat_tools = ojson::array();
    for_each_object(*tools, "tools", "an array", [&](const ojson& t, const std::string& where) {
      const std::string type = string_or(t, "type", where, "");
      if (type != "function") {
        throw bad_request("'" + where + ".type' '" + type + "' is not supported: this server calls functions only",
                          where + ".type");
      }
      ojson fn = ojson::object();
      for (const char* key : {"name", "description", "parameters"}) {
        if (const ojson* v = get(t, key)) fn[key] = *v;
      }
      chat_tools.push_back({{"type", "function"}, {"function", fn}});
    });
    chat["tools"] = chat_tools;
    out.echo["tools"] = *tools;
  } else {
    out.echo["tools"] = ojson::array();
  }
  if (const ojson* choice = get(body, "tool_choice")) {
    if (choice->is_string()) {
      chat["tool_choice"] = *choice;
    } else if (choice->is_object() && string_or(*choice, "type", "tool_choice", "") == "function" &&
               get(*choice, "name")) {
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
      const std::string type = string_or(*f, "type", "text.format", "");
      if (type == "json_schema") {
        const ojson* schema = get(*f, "schema");
        if (!schema || !schema->is_object()) {
          throw bad_request("'text.format.schema' must be a JSON Schema object", "text.format.schema");
        }
        ojson js = {{"name", string_or(*f, "name", "text.format", "response")}, {"schema", *schema}};
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
