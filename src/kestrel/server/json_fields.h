// Small readers of request bodies shared by the wire formats that translate onto chat requests
// (responses_request.cpp, messages_request.cpp): a field that is absent or null reads as absent,
// and a value's JSON kind is named in words for 400 messages.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

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

}  // namespace kestrel::server::json_fields
