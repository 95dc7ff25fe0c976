#include "kestrel/text/chat_tools.h"

#include <cctype>

#include "kestrel/base/error.h"

namespace kestrel::text {
namespace {

using nlohmann::json;
constexpr std::string_view kQuote = "<|\"|>";

std::string trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string g4str(std::string_view s) { return std::string(kQuote) + std::string(s) + std::string(kQuote); }

std::string str_or_empty(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A Gemma 4 string list: [<|"|>a<|"|>,<|"|>b<|"|>].
std::string string_list(const json& items) {
  std::string out = "[";
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += ",";
    first = false;
    out += g4str(item.is_string() ? item.get<std::string>() : item.dump());
  }
  return out + "]";
}

std::string type_of(const json& schema) {
  auto it = schema.find("type");
  if (it == schema.end()) return "";
  if (it->is_string()) return upper(it->get<std::string>());
  return "";
}

// The properties of a JSON Schema object in Gemma 4's declaration syntax.
std::string declare_properties(const json& properties) {
  std::string out;
  bool first = true;
  for (const auto& [key, value] : properties.items()) {
    if (!value.is_object()) continue;
    if (!first) out += ",";
    first = false;
    std::vector<std::string> parts;
    if (auto d = str_or_empty(value, "description"); !d.empty()) parts.push_back("description:" + g4str(d));
    const std::string type = type_of(value);
    if (type == "STRING" && value.contains("enum") && value["enum"].is_array()) {
      parts.push_back("enum:" + gemma4_value(value["enum"], true));
    }
    if (type == "ARRAY" && value.contains("items") && value["items"].is_object() && !value["items"].empty()) {
      std::string items = "items:{";
      bool first_item = true;
      for (const auto& [ik, iv] : value["items"].items()) {
        if (iv.is_null()) continue;
        if (!first_item) items += ",";
        first_item = false;
        if (ik == "properties" && iv.is_object()) {
          items += "properties:{" + declare_properties(iv) + "}";
        } else if (ik == "required" && iv.is_array()) {
          items += "required:" + string_list(iv);
        } else if (ik == "type" && iv.is_string()) {
          items += "type:" + g4str(upper(iv.get<std::string>()));
        } else {
          items += ik + ":" + gemma4_value(iv, true);
        }
      }
      parts.push_back(items + "}");
    }
    if (value.value("nullable", false) == true) parts.push_back("nullable:true");
    if (type == "OBJECT" && value.contains("properties") && value["properties"].is_object()) {
      parts.push_back("properties:{" + declare_properties(value["properties"]) + "}");
      if (value.contains("required") && value["required"].is_array() && !value["required"].empty()) {
        parts.push_back("required:" + string_list(value["required"]));
      }
    }
    parts.push_back("type:" + g4str(type));
    out += key + ":{";
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? "," : "") + parts[i];
    out += "}";
  }
  return out;
}

std::string declare_function(const ToolDefinition& tool) {
  std::string out = "declaration:" + tool.name + "{description:" + g4str(tool.description);
  const json& p = tool.parameters;
  if (p.is_object() && !p.empty()) {
    std::vector<std::string> parts;
    if (p.contains("properties") && p["properties"].is_object() && !p["properties"].empty()) {
      parts.push_back("properties:{" + declare_properties(p["properties"]) + "}");
    }
    if (p.contains("required") && p["required"].is_array() && !p["required"].empty()) {
      parts.push_back("required:" + string_list(p["required"]));
    }
    if (auto t = type_of(p); !t.empty()) parts.push_back("type:" + g4str(t));
    out += ",parameters:{";
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? "," : "") + parts[i];
    out += "}";
  }
  return out + "}";
}

// Drops <|channel>...<channel|> spans (earlier thinking) from an assistant's content.
std::string strip_thinking(std::string_view text) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    const size_t open = text.find("<|channel>", pos);
    if (open == std::string_view::npos) break;
    out += text.substr(pos, open - pos);
    const size_t close = text.find("<channel|>", open);
    if (close == std::string_view::npos) {
      pos = text.size();
      break;
    }
    pos = close + std::string_view("<channel|>").size();
  }
  out += text.substr(pos);
  return trim(out);
}

std::string role_name(const std::string& role) {
  if (role == "assistant" || role == "model") return "model";
  if (role == "user" || role == "system" || role == "developer") return role;
  throw Error("chat: unknown role '" + role + "' (expected system, developer, user, assistant or tool)");
}

bool is_assistant(const std::string& role) { return role == "assistant" || role == "model"; }

// --- parsing Gemma 4 values ---------------------------------------------------------------

struct ValueParser {
  std::string_view s;
  size_t pos = 0;
  bool ok = true;

  bool starts(std::string_view t) const { return s.substr(pos, t.size()) == t; }
  void skip_ws() {
    while (pos < s.size() && std::isspace(static_cast<unsigned char>(s[pos]))) ++pos;
  }
  std::string read_quoted() {  // after starts(kQuote)
    pos += kQuote.size();
    const size_t end = s.find(kQuote, pos);
    if (end == std::string_view::npos) {
      ok = false;
      return "";
    }
    std::string v(s.substr(pos, end - pos));
    pos = end + kQuote.size();
    return v;
  }
  json value(int depth) {
    if (depth > 64) {
      ok = false;
      return nullptr;
    }
    skip_ws();
    if (starts(kQuote)) return read_quoted();
    if (pos >= s.size()) {
      ok = false;
      return nullptr;
    }
    if (s[pos] == '{') {
      ++pos;
      json obj = json::object();
      skip_ws();
      if (pos < s.size() && s[pos] == '}') {
        ++pos;
        return obj;
      }
      while (ok) {
        skip_ws();
        std::string key;
        if (starts(kQuote)) {
          key = read_quoted();
        } else {
          const size_t colon = s.find(':', pos);
          if (colon == std::string_view::npos) {
            ok = false;
            break;
          }
          key = trim(s.substr(pos, colon - pos));
          pos = colon;
        }
        skip_ws();
        if (key.empty() || pos >= s.size() || s[pos] != ':') {
          ok = false;
          break;
        }
        ++pos;
        obj[key] = value(depth + 1);
        skip_ws();
        if (pos < s.size() && s[pos] == ',') {
          ++pos;
          continue;
        }
        if (pos < s.size() && s[pos] == '}') {
          ++pos;
          break;
        }
        ok = false;
      }
      return obj;
    }
    if (s[pos] == '[') {
      ++pos;
      json arr = json::array();
      skip_ws();
      if (pos < s.size() && s[pos] == ']') {
        ++pos;
        return arr;
      }
      while (ok) {
        arr.push_back(value(depth + 1));
        skip_ws();
        if (pos < s.size() && s[pos] == ',') {
          ++pos;
          continue;
        }
        if (pos < s.size() && s[pos] == ']') {
          ++pos;
          break;
        }
        ok = false;
      }
      return arr;
    }
    // A bare scalar: up to the next delimiter; a JSON number/literal, else kept as text.
    const size_t end = s.find_first_of(",}]", pos);
    const std::string token = trim(s.substr(pos, end == std::string_view::npos ? s.size() - pos : end - pos));
    pos = end == std::string_view::npos ? s.size() : end;
    json v = json::parse(token, nullptr, false);
    if (v.is_discarded() || v.is_structured() || token.empty()) return token;
    return v;
  }
};

}  // namespace

std::string gemma4_value(const json& value, bool quote_keys) {
  if (value.is_null()) return "null";
  if (value.is_string()) return g4str(value.get<std::string>());
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : value.items()) {  // nlohmann::json keeps keys sorted
      if (!first) out += ",";
      first = false;
      out += (quote_keys ? g4str(k) : k) + ":" + gemma4_value(v, quote_keys);
    }
    return out + "}";
  }
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) out += (i ? "," : "") + gemma4_value(value[i], quote_keys);
    return out + "]";
  }
  return value.dump();
}

json parse_gemma4_value(std::string_view text) {
  ValueParser p{text};
  json v = p.value(0);
  p.skip_ws();
  if (!p.ok || p.pos != text.size()) return json(json::value_t::discarded);
  return v;
}

std::string render_gemma4(const std::vector<Message>& messages, const std::vector<ToolDefinition>& tools,
                          bool add_generation_prompt, bool enable_thinking) {
  std::string out = "<bos>";
  size_t first = 0;
  const bool has_system = !messages.empty() && (messages[0].role == "system" || messages[0].role == "developer");
  std::string last_kind;  // "", "tool_call" or "tool_response": how the text ends
  if (enable_thinking || !tools.empty() || has_system) {
    out += "<|turn>system\n";
    if (enable_thinking) out += "<|think|>\n";
    if (has_system) {
      out += trim(messages[0].content);
      first = 1;
    }
    for (const auto& tool : tools) out += "<|tool>" + declare_function(tool) + "<tool|>";
    out += "<turn|>\n";
  }
  size_t last_user = SIZE_MAX;
  for (size_t i = first; i < messages.size(); ++i) {
    if (messages[i].role == "user") last_user = i;
  }
  std::string prev_role;
  for (size_t i = first; i < messages.size(); ++i) {
    const Message& m = messages[i];
    if (m.role == "tool") {
      // Rendered inside the assistant turn that made the call; a stray one is an error.
      if (i == first || (!is_assistant(messages[i - 1].role) && messages[i - 1].role != "tool")) {
        throw Error("chat: a tool message must follow an assistant message with tool_calls");
      }
      continue;
    }
    const std::string role = role_name(m.role);
    last_kind.clear();
    if (!(role == "model" && is_assistant(prev_role))) out += "<|turn>" + role + "\n";
    if (!m.reasoning.empty() && (last_user == SIZE_MAX || i > last_user)) {
      out += "<|channel>thought\n" + m.reasoning + "\n<channel|>";
    }
    for (const auto& call : m.tool_calls) {
      out += "<|tool_call>call:" + call.name + "{";
      bool first_arg = true;
      if (call.arguments.is_object()) {
        for (const auto& [k, v] : call.arguments.items()) {
          out += (first_arg ? "" : ",") + k + ":" + gemma4_value(v, false);
          first_arg = false;
        }
      }
      out += "}<tool_call|>";
      last_kind = "tool_call";
    }
    bool responded = false;
    if (!m.tool_calls.empty()) {
      for (size_t j = i + 1; j < messages.size() && messages[j].role == "tool"; ++j) {
        const Message& t = messages[j];
        std::string name = t.name.empty() ? "unknown" : t.name;
        for (const auto& call : m.tool_calls) {
          if (!call.id.empty() && call.id == t.tool_call_id) name = call.name;
        }
        out += "<|tool_response>response:" + name + "{value:" + gemma4_value(t.content, false) + "}<tool_response|>";
        responded = true;
        last_kind = "tool_response";
      }
    }
    const std::string content = role == "model" ? strip_thinking(m.content) : trim(m.content);
    out += content;
    std::string next_role;
    for (size_t j = i + 1; j < messages.size(); ++j) {
      if (messages[j].role != "tool") {
        next_role = messages[j].role;
        break;
      }
    }
    const bool continues = role == "model" && is_assistant(next_role) && (m.tool_calls.empty() || responded);
    if (last_kind == "tool_call" && !responded) {
      out += "<|tool_response>";
    } else if (continues) {
      // the next assistant message continues this model turn
    } else if (!(responded && content.empty() && next_role.empty())) {
      out += "<turn|>\n";
    }
    prev_role = m.role;
  }
  if (add_generation_prompt) {
    if (last_kind.empty()) {
      out += "<|turn>model\n";
    } else if (last_kind == "tool_response" && enable_thinking) {
      out += "<|channel>thought\n";
    }
  }
  return out;
}

std::string render_gemma3_tools(const std::vector<Message>& messages, const std::vector<ToolDefinition>& tools,
                                bool add_generation_prompt) {
  std::string system;
  size_t first = 0;
  if (!messages.empty() && (messages[0].role == "system" || messages[0].role == "developer")) {
    system = messages[0].content;  // not trimmed, as render_gemma3 (Gemma 3's template)
    first = 1;
  }
  if (!tools.empty()) {
    if (!system.empty()) system += "\n\n";
    system +=
        "You can call these functions (one JSON object each):\n";
    for (const auto& tool : tools) {
      json decl = {{"name", tool.name}, {"description", tool.description}, {"parameters", tool.parameters}};
      system += decl.dump() + "\n";
    }
    system +=
        "To call a function, answer with only <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call> "
        "(one block per call). Results come back as <tool_response name=\"NAME\">...</tool_response>.";
  }
  std::string out = "<bos>";
  size_t turn = 0;  // index of the turn being written, for alternation
  for (size_t i = first; i < messages.size(); ++i) {
    const Message& m = messages[i];
    std::string role;
    std::string body;
    if (m.role == "tool") {
      role = "user";
      for (; i < messages.size() && messages[i].role == "tool"; ++i) {
        const Message& t = messages[i];
        std::string name = t.name;
        for (size_t k = i; k-- > first && name.empty();) {
          for (const auto& call : messages[k].tool_calls) {
            if (call.id == t.tool_call_id) name = call.name;
          }
        }
        if (!body.empty()) body += "\n";
        body += "<tool_response name=\"" + name + "\">" + trim(t.content) + "</tool_response>";
      }
      --i;
    } else if (m.role == "user") {
      role = "user";
      body = trim(m.content);
    } else if (is_assistant(m.role)) {
      role = "model";
      body = trim(m.content);
      for (const auto& call : m.tool_calls) {
        if (!body.empty()) body += "\n";
        body += "<tool_call>" + json{{"name", call.name}, {"arguments", call.arguments}}.dump() + "</tool_call>";
      }
    } else if (m.role == "system" || m.role == "developer") {
      throw Error("chat: a system message may only come first");
    } else {
      throw Error("chat: unknown role '" + m.role + "' (expected system, user, assistant or tool)");
    }
    if ((role == "user") != (turn % 2 == 0)) {
      throw Error("chat: conversation roles must alternate user/assistant/user/assistant/... "
                  "(message " + std::to_string(i) + " is '" + m.role + "')");
    }
    out += "<start_of_turn>" + role + "\n" + (turn == 0 && !system.empty() ? system + "\n\n" : "") + body +
           "<end_of_turn>\n";
    ++turn;
  }
  // No turn to fold the system text into: it is the user turn (as render_gemma3).
  if (turn == 0 && !trim(system).empty()) out += "<start_of_turn>user\n" + trim(system) + "<end_of_turn>\n";
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace kestrel::text
