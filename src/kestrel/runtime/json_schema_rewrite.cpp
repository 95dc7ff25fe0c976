#include <string_view>

#include <nlohmann/json.hpp>

#include "kestrel/runtime/grammar.h"

namespace kestrel::runtime {
namespace {

using ordered_json = nlohmann::ordered_json;

// RFC 3339 section 5.6, restricted to values every validator accepts (see grammar.h).
constexpr std::string_view kFullDate =
    "([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})-"
    "((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))";
// An address of bounded length (RFC 5321 allows 64 + 255 characters; xgrammar's "email" is
// unbounded, and a small model may write one forever): dot-separated atoms before the @, up to
// four labels and a top-level domain after it.
constexpr std::string_view kEmail =
    "[A-Za-z0-9_+-]{1,32}(\\.[A-Za-z0-9_+-]{1,32}){0,3}@[A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?"
    "(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?){0,3}\\.[A-Za-z]{2,12}";
constexpr std::string_view kFullTime =
    "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";

void rewrite(ordered_json& schema) {
  if (schema.is_array()) {
    for (auto& item : schema) rewrite(item);
    return;
  }
  if (!schema.is_object()) return;
  if (const auto f = schema.find("format"); f != schema.end() && f->is_string()) {
    const std::string format = f->get<std::string>();
    std::string pattern;
    if (format == "date") pattern = kFullDate;
    if (format == "time") pattern = kFullTime;
    if (format == "email") pattern = kEmail;
    if (format == "date-time") pattern = std::string(kFullDate) + "T" + std::string(kFullTime);
    if (!pattern.empty()) {
      schema.erase("format");
      schema["pattern"] = pattern;
    }
  }
  for (auto& [key, value] : schema.items()) {
    if (key == "enum" || key == "const" || key == "default" || key == "examples") continue;
    // Maps from names to schemas: a property called "enum" is a schema, not data.
    if ((key == "properties" || key == "$defs" || key == "definitions" || key == "patternProperties") &&
        value.is_object()) {
      for (auto& [name, sub] : value.items()) rewrite(sub);
      continue;
    }
    rewrite(value);
  }
}

}  // namespace

std::string with_bounded_formats(const std::string& schema) {
  ordered_json doc = ordered_json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return schema;  // check_json_schema reports it
  rewrite(doc);
  return doc.dump();
}

}  // namespace kestrel::runtime
