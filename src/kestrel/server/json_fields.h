// Small readers of request bodies shared by the wire formats that translate onto chat requests
// (responses_request.cpp, messages_request.cpp): a field that is absent or null reads as absent,
// a value's JSON kind is named in words, and a wrong value is a 400 ApiError naming the field
// ('input[2].call_id' must be a string, got a number).
#pragma once

#include <nlohmann/json.hpp>

#include <initializer_list>
#include <string>
#include <string_view>

#include "kestrel/server/api_error.h"

namespace kestrel::server::json_fields {

/// The JSON kind of `v` as an error message names it ("a string", "an array", ..., "null").
inline std::string kind(const nlohmann::ordered_json& v) {
  if (v.is_string()) return "a string";
  if (v.is_number()) return "a number";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

/// `o[key]`, or null when the object lacks it or holds null there (`o` must be an object).
inline const nlohmann::ordered_json* get(const nlohmann::ordered_json& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

/// Throws 400 "'where' must be <expected>, got <kind of v>" with param `where`.
[[noreturn]] inline void wrong(const std::string& where, const char* expected, const nlohmann::ordered_json& v) {
  throw bad_request("'" + where + "' must be " + expected + ", got " + kind(v), where);
}

/// `o[key]` when it is a string, else 400 naming `where`.`key` (`o` must be an object).
inline const nlohmann::ordered_json& string_field(const nlohmann::ordered_json& o, const char* key,
                                                  const std::string& where) {
  const nlohmann::ordered_json* v = get(o, key);
  if (!v || !v->is_string()) throw bad_request("'" + where + "." + key + "' must be a string", where + "." + key);
  return *v;
}

/// `o[key]` as a string, `fallback` when absent or null, else 400 naming `where`.`key`.
inline std::string string_or(const nlohmann::ordered_json& o, const char* key, const std::string& where,
                             std::string fallback) {
  const nlohmann::ordered_json* v = get(o, key);
  if (!v) return fallback;
  if (!v->is_string()) wrong(where + "." + key, "a string", *v);
  return v->get<std::string>();
}

/// Calls f(element, "where[i]") for each element of the array `a`, which must be an array of
/// objects (else 400 naming the array or the element).
template <typename F>
void for_each_object(const nlohmann::ordered_json& a, const std::string& where, const char* expected, F&& f) {
  if (!a.is_array()) wrong(where, expected, a);
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!a[i].is_object()) wrong(at, "an object", a[i]);
    f(a[i], at);
  }
}

/// The text of a message's content: a string, or an array of parts whose "type" is one of
/// `types`, each with a string "text", joined. Another type is a 400 that lists `accepted`.
inline std::string content_text(const nlohmann::ordered_json& content, const std::string& where,
                                std::initializer_list<std::string_view> types, const char* accepted) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  for_each_object(content, where, "a string or an array of content parts", [&](const nlohmann::ordered_json& part,
                                                                               const std::string& at) {
    const std::string type = string_or(part, "type", at, "");
    bool known = false;
    for (std::string_view t : types) known = known || type == t;
    if (!known) {
      throw bad_request("'" + at + ".type' " + (type.empty() ? "is missing" : "'" + type + "' is not supported") +
                            " (" + accepted + ")", at + ".type");
    }
    out += string_field(part, "text", at).get<std::string>();
  });
  return out;
}

}  // namespace kestrel::server::json_fields
