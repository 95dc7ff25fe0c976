#include "kestrel/server/tool_grammar.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

namespace kestrel::server {
namespace {

using nlohmann::json;
using runtime::InvalidGrammar;

// The tools a forced reply may call, with their index in the request (for errors).
std::vector<std::pair<size_t, const text::ToolDefinition*>> callable(const ForcedToolChoice& choice) {
  std::vector<std::pair<size_t, const text::ToolDefinition*>> out;
  for (size_t i = 0; i < choice.tools.size(); ++i) {
    if (choice.name.empty() || choice.tools[i].name == choice.name) out.emplace_back(i, &choice.tools[i]);
  }
  if (out.empty()) throw InvalidGrammar("no tool named '" + choice.name + "' to force");
  return out;
}

std::string tool_where(size_t index, const text::ToolDefinition& tool) {
  return "tools[" + std::to_string(index) + "] (" + tool.name + ")";
}

// Absent or {} parameters: any JSON object. Anything else must describe an object.
bool any_object(const json& parameters) { return !parameters.is_object() || parameters.empty(); }

void check_object_schema(const json& parameters, const std::string& where) {
  auto type = parameters.find("type");
  if (type != parameters.end() && !(type->is_string() && *type == "object")) {
    throw InvalidGrammar(where + ": function parameters must be an object schema ('type': 'object'), got 'type': " +
                             type->dump(),
                         "type");
  }
}

// --- Gemma 4 -------------------------------------------------------------------------------

// An xgrammar EBNF string literal.
std::string literal(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// What Gemma 4's value syntax cannot carry inside a string or a bare key: a marker's start or end.
bool has_marker(std::string_view s) {
  return s.find("<|") != std::string_view::npos || s.find("|>") != std::string_view::npos;
}

// Shared rules: any value (for untyped schemas and absent parameters), strings, numbers.
// A string body never holds "<|" or "|>": as text they would read as Gemma 4's markers
// (<|"|> ends the string, <tool_call|> the call). Numbers have at most 16 digits before and
// after the point, keys at most 64 characters.
constexpr const char* kGemma4Common = R"(g4_chars ::= ([^<|] | "|"* "<"+ [^<|] | "|"+ [^<|>])* ("|"* "<"+ | "|"+)?
g4_str ::= g4_q g4_chars g4_q
g4_uint ::= "0" | [1-9] [0-9]{0,15}
g4_int ::= "-"? g4_uint
g4_num ::= g4_int ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?
g4_key ::= [A-Za-z_] [A-Za-z0-9_]{0,63}
g4_any ::= g4_str | g4_num | "true" | "false" | "null" | g4_obj | g4_arr
g4_obj ::= "{" (g4_key ":" g4_any ("," g4_key ":" g4_any)*)? "}"
g4_arr ::= "[" (g4_any ("," g4_any)*)? "]"
)";

// Annotation keywords: say nothing about the value.
const std::set<std::string> kAnnotations = {"description", "title", "default", "examples", "$comment",
                                            "deprecated", "readOnly", "writeOnly", "$schema", "$id"};

class Gemma4Writer {
 public:
  Gemma4Writer(const Gemma4ToolTokens& tokens, std::string where, std::string prefix)
      : tokens_(tokens), where_(std::move(where)), prefix_(std::move(prefix)) {}

  // An EBNF expression for a value matching `schema` (at JSON pointer `ptr`).
  std::string value(const json& schema, const std::string& ptr, int depth) {
    if (depth > 32) fail(ptr, "", "nests deeper than 32 levels");
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return "g4_any";
      fail(ptr, "", "is false: no value matches");
    }
    if (!schema.is_object()) fail(ptr, "", "is not a schema object");
    static const std::set<std::string> kKnown = {"type",     "properties", "required", "additionalProperties",
                                                 "items",    "minItems",   "maxItems", "enum",
                                                 "const",    "maxLength",  "nullable", "minimum",
                                                 "maximum"};
    for (const auto& [key, v] : schema.items()) {
      if (!kKnown.count(key) && !kAnnotations.count(key)) fail(ptr, key, "is not supported in the Gemma 4 tool format");
    }
    std::vector<std::string> alternatives;
    if (schema.contains("enum") || schema.contains("const")) {
      const json values = schema.contains("const") ? json::array({schema["const"]}) : schema["enum"];
      const char* kw = schema.contains("const") ? "const" : "enum";
      if (!values.is_array() || values.empty()) fail(ptr, kw, "must be a non-empty array");
      for (const auto& v : values) alternatives.push_back(scalar_literal(v, ptr, kw));
    } else {
      std::vector<std::string> types;
      if (auto t = schema.find("type"); t != schema.end()) {
        if (t->is_string()) {
          types.push_back(t->get<std::string>());
        } else if (t->is_array() && !t->empty()) {
          for (const auto& e : *t) {
            if (!e.is_string()) fail(ptr, "type", "must be a string or a list of strings");
            types.push_back(e.get<std::string>());
          }
        } else {
          fail(ptr, "type", "must be a string or a list of strings");
        }
      } else if (schema.contains("properties")) {
        types.push_back("object");
      } else if (schema.contains("items")) {
        types.push_back("array");
      }
      if (types.empty()) {
          return "g4_any";
      }
      // The keywords each type uses; any other (but annotations) is refused.
      std::set<std::string> used;
      for (const auto& type : types) {
        if (type == "string") used.insert("maxLength");
        if (type == "integer" || type == "number") used.insert({"minimum", "maximum"});
        if (type == "array") used.insert({"items", "minItems", "maxItems"});
        if (type == "object") used.insert({"properties", "required", "additionalProperties"});
      }
      check_unused(schema, ptr, used);
      for (const auto& type : types) alternatives.push_back(typed(type, schema, ptr, depth));
    }
    if (schema.value("nullable", false) == true) alternatives.push_back("\"null\"");
    std::string expr;
    for (size_t i = 0; i < alternatives.size(); ++i) expr += (i ? " | " : "") + alternatives[i];
    return alternatives.size() == 1 ? expr : "(" + expr + ")";
  }

  // An object with the given properties (sorted keys, as Gemma 4 writes them).
  std::string object(const json& schema, const std::string& ptr, int depth) {
    const json* props = nullptr;
    if (auto p = schema.find("properties"); p != schema.end()) {
      if (!p->is_object()) fail(ptr, "properties", "must be an object");
      props = &*p;
    }
    std::set<std::string> required;
    if (auto r = schema.find("required"); r != schema.end()) {
      if (!r->is_array()) fail(ptr, "required", "must be an array of property names");
      for (const auto& name : *r) {
        if (!name.is_string()) fail(ptr, "required", "must be an array of property names");
        if (!props || !props->contains(name.get<std::string>())) {
          fail(ptr, "required", "names '" + name.get<std::string>() + "', which is not in properties");
        }
        required.insert(name.get<std::string>());
      }
    }
    bool closed = props != nullptr;  // listed properties only (strict, as OpenAI's strict mode)
    if (auto a = schema.find("additionalProperties"); a != schema.end()) {
      if (a->is_boolean() && !a->get<bool>()) {
        closed = true;
      } else if (props != nullptr && !props->empty()) {
        fail(ptr, "additionalProperties", "other than false is not supported next to properties");
      }
    }
    if (!closed) return "g4_obj";
    if (!props || props->empty()) return "\"{}\"";
    // Sorted keys (nlohmann::json keeps them sorted); each optional key may be left out.
    // first_i: the rest from key i on, nothing written yet; after_i: something written.
    std::vector<std::pair<std::string, std::string>> kv;  // key, value expression
    for (const auto& [key, sub] : props->items()) {
      if (key.empty() || key.find_first_of(":,{}[]<>|\"' \t\n\r") != std::string::npos) {
        fail(ptr + "/properties", key, "cannot be written as a bare Gemma 4 key (use letters, digits, _ . - $)");
      }
      kv.emplace_back(key, value(sub, ptr + "/properties/" + key, depth + 1));
    }
    const std::string base = fresh("obj");
    auto first = [&](size_t i) { return i == kv.size() ? std::string("\"\"") : base + "_f" + std::to_string(i); };
    auto after = [&](size_t i) { return i == kv.size() ? std::string("\"\"") : base + "_a" + std::to_string(i); };
    for (size_t i = kv.size(); i-- > 0;) {
      const std::string pair = literal(kv[i].first + ":") + " " + kv[i].second;
      const bool req = required.count(kv[i].first) > 0;
      rules_ += after(i) + " ::= \",\" " + pair + " " + after(i + 1) + (req ? "" : " | " + after(i + 1)) + "\n";
      rules_ += first(i) + " ::= " + pair + " " + after(i + 1) + (req ? "" : " | " + first(i + 1)) + "\n";
    }
    rules_ += base + " ::= \"{\" " + first(0) + " \"}\"\n";
    return base;
  }

  std::string rules() const { return rules_; }
  [[noreturn]] void fail(const std::string& ptr, const std::string& keyword, const std::string& why) const {
    const std::string at = ptr.empty() ? "parameters" : "parameters" + ptr;
    throw InvalidGrammar(where_ + ": " + (keyword.empty() ? at : "'" + keyword + "' at " + at) + " " + why,
                         keyword);
  }

 private:
  std::string fresh(const char* kind) { return prefix_ + kind + std::to_string(counter_++); }

  std::string quote() const { return "Token(" + std::to_string(tokens_.quote) + ")"; }

  // The keywords of `schema` that the type(s) did not use.
  void check_unused(const json& schema, const std::string& ptr, const std::set<std::string>& used) const {
    static const std::set<std::string> kAlways = {"type", "nullable", "enum", "const"};
    for (const auto& [key, v] : schema.items()) {
      if (!kAnnotations.count(key) && !kAlways.count(key) && !used.count(key)) {
        fail(ptr, key, "does not apply to this type here (not supported)");
      }
    }
  }

  std::string scalar_literal(const json& v, const std::string& ptr, const char* kw) const {
    if (v.is_string()) {
      if (has_marker(v.get<std::string>())) fail(ptr, kw, "holds a string with '<|' or '|>'");
      // (appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "(" + std::string&&)
      std::string out = "(";
      out += quote();
      out += " ";
      out += literal(v.get<std::string>());
      out += " ";
      out += quote();
      return out + ")";
    }
    if (v.is_number() || v.is_boolean() || v.is_null()) return literal(v.dump());
    fail(ptr, kw, "may only list strings, numbers, booleans and null");
  }

  static std::optional<double> number_of(const json& schema, const char* key) {
    auto it = schema.find(key);
    if (it == schema.end()) return std::nullopt;
    return it->is_number() ? std::optional<double>(it->get<double>()) : std::nullopt;
  }

  std::string typed(const std::string& type, const json& schema, const std::string& ptr, int depth) {
    if (type == "string") {
      if (auto m = schema.find("maxLength"); m != schema.end()) {
        if (!m->is_number_integer() || m->get<int64_t>() < 0) fail(ptr, "maxLength", "must be a non-negative integer");
        const std::string body = fresh("chars");
        if (m->get<int64_t>() == 0) return "(" + quote() + " " + quote() + ")";
        rules_ += body + "[max_chars=" + std::to_string(m->get<int64_t>()) + "] ::= g4_chars\n";
        return "(" + quote() + " " + body + " " + quote() + ")";
      }
      return "g4_str";
    }
    if (type == "integer" || type == "number") {
      const auto lo = number_of(schema, "minimum");
      const auto hi = number_of(schema, "maximum");
      if (schema.contains("minimum") && !lo) fail(ptr, "minimum", "must be a number");
      if (schema.contains("maximum") && !hi) fail(ptr, "maximum", "must be a number");
      if (type == "integer" && lo && hi) {
        const double a = std::ceil(*lo), b = std::floor(*hi);
        if (b < a) fail(ptr, "maximum", "is below minimum");
        if (b - a > 255) fail(ptr, "maximum", "is supported with minimum for at most 256 integers");
        std::string expr;
        for (auto i = static_cast<int64_t>(a); i <= static_cast<int64_t>(b); ++i) {
          expr += (expr.empty() ? "" : " | ") + literal(std::to_string(i));
        }
        return "(" + expr + ")";
      }
      if (hi) fail(ptr, "maximum", "is supported only for integers, together with minimum");
      const std::string integer = lo && *lo == 1 && type == "integer" ? "([1-9] [0-9]{0,15})"
                                  : lo && *lo == 0                   ? "g4_uint"
                                                                     : "g4_int";
      if (lo && *lo != 0 && !(*lo == 1 && type == "integer")) {
        fail(ptr, "minimum", "is supported only as 0 (or 1 for integers) without maximum");
      }
      if (type == "integer") return integer;
      return "(" + integer + " (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?)";
    }
    if (type == "boolean") {
      return "(\"true\" | \"false\")";
    }
    if (type == "null") {
      return "\"null\"";
    }
    if (type == "array") {
      std::string item = "g4_any";
      if (auto it = schema.find("items"); it != schema.end()) item = value(*it, ptr + "/items", depth + 1);
      auto count = [&](const char* key) -> std::optional<int64_t> {
        auto it = schema.find(key);
        if (it == schema.end()) return std::nullopt;
        if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 4096) {
          fail(ptr, key, "must be an integer from 0 to 4096");
        }
        return it->get<int64_t>();
      };
      const int64_t lo = count("minItems").value_or(0);
      const auto hi = count("maxItems");
      if (hi && *hi < lo) fail(ptr, "maxItems", "is below minItems");
      if (hi && *hi == 0) return "\"[]\"";
      const std::string more = "(\",\" " + item + ")" + "{" + std::to_string(lo > 0 ? lo - 1 : 0) + "," +
                               (hi ? std::to_string(*hi - 1) : std::string()) + "}";
      const std::string items = item + " " + more;
      return "(\"[\" " + (lo > 0 ? items : "(" + items + ")?") + " \"]\")";
    }
    if (type == "object") {
      return object(schema, ptr, depth);
    }
    fail(ptr, "type", "'" + type + "' is not a JSON Schema type");
  }

  const Gemma4ToolTokens& tokens_;
  std::string where_;
  std::string prefix_;
  std::string rules_;
  int counter_ = 0;
};

}  // namespace

bool forces_tool_call(const GenerationRequest& request) {
  return !request.tools.empty() && request.tool_choice != "auto" && request.tool_choice != "none";
}

std::string gemma3_tool_structural_tag(const ForcedToolChoice& choice) {
  json calls = json::array();
  for (const auto& [index, tool] : callable(choice)) {
    const std::string where = tool_where(index, *tool);
    json schema = tool->parameters;
    if (any_object(schema)) {
      schema = {{"type", "object"}, {"additionalProperties", true}};
    } else {
      check_object_schema(schema, where);
      try {
        runtime::check_json_schema(schema.dump());
      } catch (const InvalidGrammar& e) {
        throw InvalidGrammar(where + ": parameters: " + e.what(), e.where());
      }
      if (!schema.contains("type")) schema["type"] = "object";
      // dates, times and e-mail addresses as the bounded patterns structured output uses
      const std::string bounded = runtime::with_bounded_formats(schema.dump());
      schema = json::parse(bounded);
    }
    calls.push_back({{"type", "tag"},
                     {"begin", "<tool_call>{\"name\": " + json(tool->name).dump() + ", \"arguments\": "},
                     {"content", {{"type", "json_schema"}, {"json_schema", schema}, {"max_whitespace_cnt", 1}}},
                     {"end", "}</tool_call>"}});
  }
  json call = calls.size() == 1 ? calls[0] : json{{"type", "or"}, {"elements", calls}};
  json format = call;
  if (choice.parallel) {
    json next = {{"type", "sequence"}, {"elements", {{{"type", "const_string"}, {"value", "\n"}}, call}}};
    format = {{"type", "sequence"},
              {"elements",
               {call,
                {{"type", "repeat"},
                 {"min", 0},
                 {"max", static_cast<int>(kMaxParallelToolCalls) - 1},
                 {"content", next}}}}};
  }
  return json{{"type", "structural_tag"}, {"format", format}}.dump();
}

std::string gemma4_tool_grammar(const ForcedToolChoice& choice, const Gemma4ToolTokens& tokens) {
  std::string rules;
  std::string calls;
  int n = 0;
  for (const auto& [index, tool] : callable(choice)) {
    // Each tool's rules get their own prefix, so that tools never share a rule name.
    std::string prefix = "t";
    prefix += std::to_string(n);
    prefix += '_';
    Gemma4Writer w(tokens, tool_where(index, *tool), prefix);
    if (tool->name.find_first_of("{}<>|: \t\n") != std::string::npos) {
      throw InvalidGrammar(tool_where(index, *tool) + ": the name cannot be written in a Gemma 4 call", "name");
    }
    std::string args = "g4_obj";
    if (!any_object(tool->parameters)) {
      check_object_schema(tool->parameters, tool_where(index, *tool));
      for (const auto& [key, v] : tool->parameters.items()) {
        static const std::set<std::string> kTop = {"type", "properties", "required", "additionalProperties"};
        if (!kTop.count(key) && !kAnnotations.count(key)) {
          w.fail("", key, "is not supported on function parameters in the Gemma 4 tool format");
        }
      }
      args = w.object(tool->parameters, "", 0);
    }
    rules += w.rules();
    const std::string rule = "g4_call" + std::to_string(n++);
    rules += rule + " ::= Token(" + std::to_string(tokens.call_open) + ") " + literal("call:" + tool->name) + " " +
             args + " Token(" + std::to_string(tokens.call_close) + ")\n";
    calls += (calls.empty() ? "" : " | ") + rule;
  }
  std::string root = "root ::= ";
  root += choice.parallel ? "(g4_call){1," + std::to_string(kMaxParallelToolCalls) + "}\n" : "g4_call\n";
  return root + "g4_call ::= " + calls + "\n" + "g4_q ::= Token(" + std::to_string(tokens.quote) + ")\n" +
         kGemma4Common + rules;
}

runtime::GrammarSpec forced_tool_grammar(ChatTemplate chat_template, const GenerationRequest& request,
                                         const text::Tokenizer& tokenizer) {
  ForcedToolChoice choice{request.tools, request.tool_choice == "required" && !request.tool_choice_named
                                             ? std::string()
                                             : request.tool_choice,
                          request.parallel_tool_calls && !request.tool_choice_named};
  runtime::GrammarSpec spec;
  spec.strict = true;
  if (chat_template == ChatTemplate::kGemma4) {
    Gemma4ToolTokens tokens;
    auto id = [&](const char* piece) {
      auto t = tokenizer.find(piece);
      if (!t) throw InvalidGrammar(std::string("the vocabulary has no ") + piece + " token for tool calls");
      return *t;
    };
    tokens.call_open = id("<|tool_call>");
    tokens.call_close = id("<tool_call|>");
    tokens.quote = id("<|\"|>");
    spec.kind = runtime::GrammarSpec::Kind::kEbnf;
    spec.text = gemma4_tool_grammar(choice, tokens);
    spec.control_tokens_as_text = true;
  } else {
    spec.kind = runtime::GrammarSpec::Kind::kStructuralTag;
    spec.text = gemma3_tool_structural_tag(choice);
  }
  return spec;
}

}  // namespace kestrel::server
