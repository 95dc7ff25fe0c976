#include <nlohmann/json.hpp>

#include "kestrel/runtime/grammar.h"

namespace kestrel::runtime {

void check_json_schema(const std::string& schema) {
  const auto doc = nlohmann::json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw InvalidGrammar("the JSON schema is not valid JSON");
  if (!doc.is_object() && doc != nlohmann::json(true)) throw InvalidGrammar("a JSON schema must be an object");
}

}  // namespace kestrel::runtime
