#include "kestrel/server/request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kestrel/server/api_error.h"

namespace kestrel::server {
namespace {

using nlohmann::json;

// The value of `key`, or nullptr when absent or null.
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string type_name(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

[[noreturn]] void wrong_type(const std::string& name, const char* expected, const json& v) {
  throw bad_request("'" + name + "' must be " + expected + ", got " + type_name(v), name);
}

std::optional<double> get_number(const json& body, const char* key, double lo, double hi) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    throw bad_request("'" + std::string(key) + "' must be between " + json(lo).dump() + " and " +
                          json(hi).dump() + ", got " + v->dump(), key);
  }
  return d;
}

std::optional<int64_t> get_int(const json& body, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  int64_t i = 0;
  if (v->is_number_float()) {  // 5.0 is accepted as 5: Python clients may send floats
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e18) wrong_type(key, "an integer", *v);
    i = static_cast<int64_t>(d);
  } else if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw bad_request("'" + std::string(key) + "' is out of range: " + v->dump(), key);
    }
    i = static_cast<int64_t>(v->get<uint64_t>());
  } else if (v->is_number_integer()) {
    i = v->get<int64_t>();
  } else {
    wrong_type(key, "an integer", *v);
  }
  if (i < lo || i > hi) {
    throw bad_request("'" + std::string(key) + "' must be between " + std::to_string(lo) + " and " +
                          std::to_string(hi) + ", got " + v->dump(), key);
  }
  return i;
}

std::optional<bool> get_bool(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(key, "a string", *v);
  return v->get<std::string>();
}

// Fields shared by both endpoints: model, sampling, stop, stream, ignore_eos, min_tokens, n,
// cache_prompt.
// response_format (OpenAI), json_schema and grammar (llama-server): what the answer must match.
void parse_structured_output(const json& body, GenerationRequest& r) {
  using Kind = runtime::GrammarSpec::Kind;
  auto set = [&](const char* param, runtime::GrammarSpec spec) {
    if (r.grammar) {
      throw bad_request(std::string("'") + param + "' and '" + r.grammar_param +
                            "' both constrain the answer; send one of them", param);
    }
    r.grammar = std::move(spec);
    r.grammar_param = param;
  };
  // A JSON Schema value: its text, and where it is in the body (re-read in the client's key order).
  // Closed by default, strict or not: an object schema without additionalProperties admits only
  // its properties (xgrammar's default strict_mode, vLLM's and llama-server's behaviour; a small
  // model given an open object invents keys until max_tokens). additionalProperties: true opens it.
  auto schema_at = [&](const json& schema, const std::string& param, const char* pointer) {
    if (!schema.is_object() && !schema.is_boolean()) wrong_type(param, "a JSON Schema object", schema);
    set(param.c_str(), {Kind::kJsonSchema, schema.dump(), true});
    r.schema_pointer = pointer;
  };
  if (const json* rf = field(body, "response_format")) {
    if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
    const json* type_field = field(*rf, "type");
    if (type_field && !type_field->is_string()) wrong_type("response_format.type", "a string", *type_field);
    const std::string type = type_field ? type_field->get<std::string>() : "";
    if (type == "json_object") {
      r.json_object = true;
      set("response_format", {Kind::kJsonObject, "", false});
    } else if (type == "json_schema") {
      const json* js = field(*rf, "json_schema");
      if (!js || !js->is_object()) {
        throw bad_request("response_format json_schema needs 'json_schema': {\"name\", \"schema\", \"strict\"}",
                          "response_format.json_schema");
      }
      const json* schema = field(*js, "schema");
      if (!schema || !(schema->is_object() || schema->is_boolean())) {
        throw bad_request("'response_format.json_schema.schema' must be a JSON Schema object",
                          "response_format.json_schema.schema");
      }
      const json* strict = field(*js, "strict");
      if (strict && !strict->is_boolean()) wrong_type("response_format.json_schema.strict", "a boolean", *strict);
      schema_at(*schema, "response_format", "/response_format/json_schema/schema");
    } else if (type != "text") {
      throw bad_request("response_format.type must be text, json_object or json_schema", "response_format.type");
    }
  }
  if (const json* schema = field(body, "json_schema")) schema_at(*schema, "json_schema", "/json_schema");
  auto text = [&](const json& v, const std::string& param) {
    if (!v.is_string()) wrong_type(param, "a string", v);
    if (v.get<std::string>().empty()) throw bad_request("'" + param + "' is empty", param);
    return v.get<std::string>();
  };
  if (const json* grammar = field(body, "grammar")) set("grammar", {Kind::kEbnf, text(*grammar, "grammar"), false});
  // vLLM's structured_outputs {json | regex | choice | grammar} and its older guided_* fields.
  auto choice = [&](const json& v, const std::string& param) {
    if (!v.is_array()) wrong_type(param, "an array of strings", v);
    if (v.empty()) throw bad_request("'" + param + "' is empty: give at least one string", param);
    std::string regex;
    for (const auto& c : v) {
      if (!c.is_string()) wrong_type(param + "[]", "a string", c);
      regex += regex.empty() ? "(" : "|";
      for (char ch : c.get<std::string>()) {
        if (std::string_view("\\^$.|?*+()[]{}/").find(ch) != std::string_view::npos) regex += '\\';
        regex += ch;
      }
    }
    return regex + ")";
  };
  if (const json* so = field(body, "structured_outputs")) {
    if (!so->is_object()) wrong_type("structured_outputs", "an object", *so);
    for (const auto& [key, value] : so->items()) {
      if (key != "json" && key != "regex" && key != "choice" && key != "grammar" && !value.is_null()) {
        throw bad_request("'structured_outputs." + key + "' is not supported (json, regex, choice or grammar)",
                          "structured_outputs." + key);
      }
    }
    if (const json* v = field(*so, "json")) schema_at(*v, "structured_outputs.json", "/structured_outputs/json");
    if (const json* v = field(*so, "regex")) set("structured_outputs.regex", {Kind::kRegex, text(*v, "structured_outputs.regex")});
    if (const json* v = field(*so, "choice")) set("structured_outputs.choice", {Kind::kRegex, choice(*v, "structured_outputs.choice")});
    if (const json* v = field(*so, "grammar")) set("structured_outputs.grammar", {Kind::kEbnf, text(*v, "structured_outputs.grammar")});
    if (!r.grammar || r.grammar_param.rfind("structured_outputs", 0) != 0) {
      throw bad_request("'structured_outputs' needs one of json, regex, choice or grammar", "structured_outputs");
    }
  }
  if (const json* v = field(body, "guided_json")) schema_at(*v, "guided_json", "/guided_json");
  if (const json* v = field(body, "guided_regex")) set("guided_regex", {Kind::kRegex, text(*v, "guided_regex")});
  if (const json* v = field(body, "guided_choice")) set("guided_choice", {Kind::kRegex, choice(*v, "guided_choice")});
  if (const json* v = field(body, "guided_grammar")) set("guided_grammar", {Kind::kEbnf, text(*v, "guided_grammar")});
}

// OpenAI's logit_bias: an object from token ids (as strings) to biases in [-100, 100].
void parse_logit_bias(const json& lb, GenerationRequest& r) {
  if (lb.is_null()) return;
  if (!lb.is_object()) wrong_type("logit_bias", "an object mapping token ids to numbers", lb);
  if (lb.size() > kMaxLogitBias) {
    throw bad_request("'logit_bias' has " + std::to_string(lb.size()) + " entries; at most " +
                          std::to_string(kMaxLogitBias) + " are allowed", "logit_bias");
  }
  for (const auto& [key, value] : lb.items()) {
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) throw bad_request("'logit_bias' keys must be token ids (non-negative integers), not '" + key + "'", "logit_bias");
    if (!value.is_number()) wrong_type("logit_bias." + key, "a number", value);
    const double bias = value.get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      throw bad_request("'logit_bias." + key + "' must be between -100 and 100", "logit_bias");
    }
    r.logit_bias.emplace_back(std::stoll(key), static_cast<float>(bias));
  }
  std::sort(r.logit_bias.begin(), r.logit_bias.end());
  // "007" and "7" name one token: refused, as ambiguous.
  for (size_t i = 1; i < r.logit_bias.size(); ++i) {
    if (r.logit_bias[i].first == r.logit_bias[i - 1].first) {
      throw bad_request("'logit_bias' names token " + std::to_string(r.logit_bias[i].first) + " twice", "logit_bias");
    }
  }
}

void parse_common(const json& body, GenerationRequest& r) {
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  parse_structured_output(body, r);
  if (auto m = get_string(body, "model")) r.model = *m;
  // OpenAI's defaults: plain sampling at temperature 1 with no truncation.
  r.sampler.temperature = 1.0f;
  r.sampler.top_k = 0;
  r.sampler.top_p = 1.0f;
  r.sampler.min_p = 0.0f;
  r.sampler.repeat_penalty = 1.0f;
  if (auto t = get_number(body, "temperature", 0, 2)) r.sampler.temperature = static_cast<float>(*t);
  if (auto p = get_number(body, "top_p", 0, 1)) r.sampler.top_p = static_cast<float>(*p);
  if (auto k = get_int(body, "top_k", -1, 1 << 30)) r.sampler.top_k = static_cast<int>(*k);
  if (auto p = get_number(body, "min_p", 0, 1)) r.sampler.min_p = static_cast<float>(*p);
  if (auto p = get_number(body, "presence_penalty", -2, 2)) r.sampler.presence_penalty = static_cast<float>(*p);
  if (auto p = get_number(body, "frequency_penalty", -2, 2)) r.sampler.frequency_penalty = static_cast<float>(*p);
  if (auto p = get_number(body, "repetition_penalty", 0.01, 100)) r.sampler.repeat_penalty = static_cast<float>(*p);
  if (auto s = get_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    r.seed = static_cast<uint64_t>(*s);
  }
  if (auto n = get_int(body, "max_tokens", 0, 1 << 24)) r.max_tokens = static_cast<size_t>(*n);
  if (auto n = get_int(body, "n", 1, static_cast<int64_t>(kMaxSamples))) r.n = static_cast<size_t>(*n);
  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStopStrings) {
        throw bad_request("'stop' has " + std::to_string(stop->size()) + " strings; at most " +
                              std::to_string(kMaxStopStrings) + " are allowed", "stop");
      }
      for (const auto& s : *stop) {
        if (!s.is_string()) wrong_type("stop", "a string or an array of strings", s);
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", *stop);
    }
    for (const auto& s : r.stop) {
      if (s.empty()) throw bad_request("'stop' strings must not be empty", "stop");
    }
  }
  if (auto s = get_bool(body, "stream")) r.stream = *s;
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    if (auto u = get_bool(*so, "include_usage")) r.include_usage = *u;
  }
  if (auto e = get_bool(body, "ignore_eos")) r.ignore_eos = *e;
  if (auto c = get_bool(body, "cache_prompt")) r.cache_prompt = *c;
  if (auto m = get_int(body, "min_tokens", 0, 1 << 24)) r.min_tokens = static_cast<size_t>(*m);
  if (const json* lb = field(body, "logit_bias")) parse_logit_bias(*lb, r);
  if (auto b = get_int(body, "best_of", 1, static_cast<int64_t>(kMaxSamples))) r.best_of = static_cast<size_t>(*b);
  if (r.best_of != 1 && r.best_of < r.n) throw bad_request("'best_of' must be at least 'n'", "best_of");
  r.best_of = std::max(r.best_of, r.n);
  if (r.stream && r.best_of > 1) {
    throw bad_request(std::string("'") + (r.n > 1 ? "n" : "best_of") + "' above 1 is not streamed: send it without 'stream'",
                      r.n > 1 ? "n" : "best_of");
  }
}

// Text of a message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::string content_text(const json& content, const std::string& where) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) wrong_type(where, "a string or an array of content parts", content);
  std::string out;
  for (const auto& part : content) {
    if (!part.is_object()) wrong_type(where + "[]", "an object", part);
    const std::string type = part.value("type", std::string());
    if (type != "text") {
      throw bad_request(where + ": content parts of type '" + type + "' are not supported (text only)", where);
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      throw bad_request(where + ": a text part needs a string 'text'", where);
    }
    out += text->get<std::string>();
  }
  return out;
}

text::ToolCall parse_tool_call(const json& tc, const std::string& where) {
  if (!tc.is_object()) wrong_type(where, "an object", tc);
  text::ToolCall call;
  if (auto id = get_string(tc, "id")) call.id = *id;
  const json* fn = field(tc, "function");
  if (!fn || !fn->is_object()) throw bad_request(where + ".function must be an object", where);
  auto name = get_string(*fn, "name");
  if (!name || name->empty()) throw bad_request(where + ".function.name must be a non-empty string", where);
  call.name = *name;
  if (const json* args = field(*fn, "arguments")) {
    json parsed = args->is_string() ? json::parse(args->get<std::string>(), nullptr, false) : *args;
    if (parsed.is_discarded() || !parsed.is_object()) {
      throw bad_request(where + ".function.arguments must be a JSON object encoded as a string", where);
    }
    call.arguments = std::move(parsed);
  }
  return call;
}

void parse_messages(const json& body, GenerationRequest& r) {
  const json* messages = field(body, "messages");
  if (!messages) throw bad_request("'messages' is required", "messages");
  if (!messages->is_array()) wrong_type("messages", "an array", *messages);
  if (messages->empty()) throw bad_request("'messages' must not be empty", "messages");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(where, "an object", m);
    auto role = get_string(m, "role");
    if (!role) throw bad_request(where + ".role is required", where + ".role");
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    bool known = false;
    for (const char* k : kRoles) known = known || *role == k;
    if (!known) {
      throw bad_request(where + ".role '" + *role + "' is not one of system, developer, user, assistant, tool",
                        where + ".role");
    }
    text::Message msg;
    msg.role = *role;
    // OpenAI's rule: every message has content, but an assistant's may be absent or null (a turn
    // of tool calls). A user turn without it would render as an empty turn, silently.
    if (const json* content = field(m, "content")) {
      msg.content = content_text(*content, where + ".content");
    } else if (msg.role != "assistant") {
      throw bad_request(where + ".content is required for a '" + msg.role +
                            "' message (a string or an array of text parts)", where + ".content");
    }
    if (auto rc = get_string(m, "reasoning_content")) msg.reasoning = *rc;
    else if (auto rs = get_string(m, "reasoning")) msg.reasoning = *rs;
    if (const json* tcs = field(m, "tool_calls")) {
      if (!tcs->is_array()) wrong_type(where + ".tool_calls", "an array", *tcs);
      for (size_t k = 0; k < tcs->size(); ++k) {
        msg.tool_calls.push_back(parse_tool_call((*tcs)[k], where + ".tool_calls[" + std::to_string(k) + "]"));
      }
    }
    if (auto id = get_string(m, "tool_call_id")) msg.tool_call_id = *id;
    if (msg.role == "tool") {
      if (auto n = get_string(m, "name")) msg.name = *n;
    }
    r.messages.push_back(std::move(msg));
  }
}

void parse_tools(const json& body, GenerationRequest& r) {
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) wrong_type(where, "an object", t);
      if (t.value("type", std::string("function")) != "function") {
        throw bad_request(where + ".type must be 'function'", where);
      }
      const json* fn = field(t, "function");
      if (!fn || !fn->is_object()) throw bad_request(where + ".function must be an object", where);
      text::ToolDefinition def;
      auto name = get_string(*fn, "name");
      if (!name || name->empty()) throw bad_request(where + ".function.name must be a non-empty string", where);
      def.name = *name;
      if (auto d = get_string(*fn, "description")) def.description = *d;
      if (const json* p = field(*fn, "parameters")) {
        if (!p->is_object()) wrong_type(where + ".function.parameters", "an object", *p);
        def.parameters = *p;
      } else {
        // OpenAI's reference: "Omitting parameters defines a function with an empty parameter
        // list" (a forced call's arguments are then {}).
        def.parameters = {{"type", "object"}, {"properties", json::object()}};
      }
      r.tools.push_back(std::move(def));
    }
  }
  if (const json* choice = field(body, "tool_choice")) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c != "none" && c != "auto" && c != "required") {
        throw bad_request("'tool_choice' must be none, auto, required or a function", "tool_choice");
      }
      r.tool_choice = c;
    } else if (choice->is_object()) {
      const json* fn = field(*choice, "function");
      auto name = fn && fn->is_object() ? get_string(*fn, "name") : std::nullopt;
      if (!name) throw bad_request("'tool_choice.function.name' is required", "tool_choice");
      bool found = false;
      for (const auto& t : r.tools) found = found || t.name == *name;
      if (!found) throw bad_request("'tool_choice' names '" + *name + "', which is not in 'tools'", "tool_choice");
      r.tool_choice = *name;
      r.tool_choice_named = true;
    } else {
      wrong_type("tool_choice", "a string or an object", *choice);
    }
  }
  if (auto parallel = get_bool(body, "parallel_tool_calls")) r.parallel_tool_calls = *parallel;
  if (r.tool_choice == "none") r.tools.clear();
  if (r.tool_choice == "required" && r.tools.empty()) {
    throw bad_request("'tool_choice' is 'required' but no 'tools' were given", "tool_choice");
  }
}

}  // namespace

size_t json_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

GenerationRequest parse_chat_request(const json& body) {
  GenerationRequest r;
  r.endpoint = Endpoint::kChat;
  parse_common(body, r);
  parse_messages(body, r);
  parse_tools(body, r);
  if (auto e = get_bool(body, "echo"); e && *e) {
    throw bad_request("'echo' belongs to /v1/completions (prompt scoring)", "echo");
  }
  if (r.best_of != r.n) throw bad_request("'best_of' belongs to /v1/completions", "best_of");
  if (auto n = get_int(body, "max_completion_tokens", 0, 1 << 24)) r.max_tokens = static_cast<size_t>(*n);
  const auto logprobs = get_bool(body, "logprobs");
  const auto top = get_int(body, "top_logprobs", 0, kMaxTopLogprobs);
  if (top && !(logprobs && *logprobs)) throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  if (logprobs && *logprobs) r.top_logprobs = static_cast<int>(top.value_or(0));
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) wrong_type("chat_template_kwargs", "an object", *kw);
    if (auto t = get_bool(*kw, "enable_thinking")) r.enable_thinking = *t;
  }
  return r;
}

std::string schema_in_client_order(std::string_view raw_body, const std::string& pointer) {
  return nlohmann::ordered_json::parse(raw_body).at(nlohmann::ordered_json::json_pointer(pointer)).dump();
}

PromptList parse_prompt_list(const json& v, const std::string& name, size_t max_items) {
  PromptList out;
  const char* expected = "a string, an array of strings, an array of token ids or an array of arrays of token ids";
  auto token_ids = [&](const json& arr) {
    std::vector<int32_t> ids;
    for (const auto& t : arr) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        throw bad_request("'" + name + "' token ids must be non-negative integers", name);
      }
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return ids;
  };
  if (v.is_string()) {
    out.texts.push_back(v.get<std::string>());
    return out;
  }
  if (!v.is_array()) wrong_type(name, expected, v);
  if (v.empty()) throw bad_request("'" + name + "' must not be empty", name);
  const json& first = v[0];
  if (v.size() > max_items && !first.is_number()) {
    throw bad_request("at most " + std::to_string(max_items) + " " + name + "s per request", name);
  }
  if (first.is_string()) {
    for (const auto& p : v) {
      if (!p.is_string()) wrong_type(name, expected, p);
      out.texts.push_back(p.get<std::string>());
    }
  } else if (first.is_number()) {
    out.ids.push_back(token_ids(v));
  } else if (first.is_array()) {
    for (const auto& p : v) {
      if (!p.is_array() || p.empty()) throw bad_request("'" + name + "' token-id lists must be non-empty arrays", name);
      out.ids.push_back(token_ids(p));
    }
  } else {
    wrong_type(name, expected, first);
  }
  return out;
}

GenerationRequest parse_completion_request(const json& body) {
  GenerationRequest r;
  r.endpoint = Endpoint::kCompletion;
  parse_common(body, r);
  const json* prompt = field(body, "prompt");
  if (!prompt) throw bad_request("'prompt' is required", "prompt");
  PromptList prompts = parse_prompt_list(*prompt, "prompt", kMaxPrompts);
  r.prompt_texts = std::move(prompts.texts);
  r.prompt_ids = std::move(prompts.ids);
  if (auto lp = get_int(body, "logprobs", 0, kMaxTopLogprobs)) r.top_logprobs = static_cast<int>(*lp);
  if (auto e = get_bool(body, "echo")) r.echo = *e;
  if (auto p = get_int(body, "prompt_logprobs", 0, kMaxTopLogprobs)) r.prompt_logprobs = static_cast<int>(*p);
  if (r.stream && (r.echo || r.prompt_logprobs >= 0)) {
    throw bad_request(std::string("'") + (r.echo ? "echo" : "prompt_logprobs") +
                          "' scores the prompt and is not streamed: send it without 'stream'",
                      r.echo ? "echo" : "prompt_logprobs");
  }
  if (field(body, "tools")) throw bad_request("'tools' belongs to /v1/chat/completions", "tools");
  return r;
}

}  // namespace kestrel::server
