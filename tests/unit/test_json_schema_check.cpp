// check_json_schema: schemas whose every keyword xgrammar enforces pass; any keyword it would
// ignore is named, with its JSON pointer. Which keywords xgrammar enforces was measured with its
// Python package (tests/python/test_json_schema_keywords.py, docs/json-schema-keywords.md).
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "kestrel/runtime/grammar.h"

using kestrel::runtime::check_json_schema;
using kestrel::runtime::InvalidGrammar;

namespace {

// The pointer check_json_schema names (where()), or "ok" when it accepts the schema.
std::string rejected_at(const std::string& schema) {
  try {
    check_json_schema(schema);
  } catch (const InvalidGrammar& e) {
    return e.where();
  }
  return "ok";
}

std::string message(const std::string& schema) {
  try {
    check_json_schema(schema);
  } catch (const InvalidGrammar& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(JsonSchemaCheck, AcceptsTheStrictSubset) {
  // What OpenAI's strict mode allows, written the way its SDK and pydantic write it.
  const char* schema = R"({
    "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Order", "type": "object",
    "description": "An order", "$comment": "annotations are accepted anywhere",
    "properties": {
      "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
      "name": {"type": "string", "minLength": 1, "maxLength": 40, "examples": ["Ada"]},
      "when": {"type": "string", "format": "date-time"},
      "kind": {"type": "string", "enum": ["retail", "wholesale"]},
      "version": {"const": 2},
      "count": {"type": "integer", "minimum": 1, "maximum": 100},
      "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
      "step": {"type": "integer", "multipleOf": 5},
      "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5, "uniqueItems": false},
      "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": false},
      "note": {"type": ["string", "null"], "maxLength": 200},
      "address": {"$ref": "#/$defs/Address"},
      "contact": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": null},
      "extra": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3,
                "propertyNames": {"pattern": "^[a-z]+$"}},
      "legacy": {"allOf": [{"$ref": "#/definitions/Old"}], "deprecated": true}
    },
    "required": ["id", "name", "when", "kind", "version", "count", "ratio", "tags", "note", "address"],
    "additionalProperties": false,
    "$defs": {
      "Address": {"type": "object", "properties": {"city": {"type": "string"}, "next": {"$ref": "#/$defs/Address"}},
                  "required": ["city"], "additionalProperties": false}
    },
    "definitions": {"Old": {"type": "boolean", "readOnly": true}}
  })";
  EXPECT_EQ(rejected_at(schema), "ok") << message(schema);
}

TEST(JsonSchemaCheck, AcceptsOtherEnforcedForms) {
  for (const char* schema : {
           "true",
           "{}",
           R"({"type": "object", "properties": {"a": true}, "required": ["a"]})",
           R"({"properties": {"a": {"type": "integer"}}, "required": ["a"]})",  // object without "type"
           R"({"items": {"type": "integer"}})",                                   // array without "type"
           R"({"type": "object", "patternProperties": {"^x[0-9]$": {"type": "integer"}}, "minProperties": 1})",
           R"({"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": false})",
           R"({"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": {"type": "string"}})",
           R"({"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 300})",
           R"({"type": "integer", "multipleOf": 3, "exclusiveMinimum": 0, "exclusiveMaximum": 10001})",
           R"({"type": "string", "enum": ["a", "b"]})",
           R"({"type": ["string", "null"], "enum": ["a", null]})",
           R"({"type": "number", "const": 1})",
           R"({"type": "string", "format": "email"})",
           R"({"type": "string", "format": "uuid", "description": "an id"})",
           R"({"type": "object", "properties": {"next": {"$ref": "#"}}})",
           R"({"$ref": "#/$defs/A", "$defs": {"A": {"type": "integer"}}, "$id": "https://example.com/a"})",
           // oneOf branches told apart by type, by value, and by a required discriminator
           R"({"oneOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]})",
           R"({"oneOf": [{"const": "a"}, {"enum": ["b", "c"]}, {"type": "integer"}]})",
           R"({"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
               "discriminator": {"propertyName": "pet"},
               "$defs": {
                 "Cat": {"type": "object", "properties": {"pet": {"const": "cat"}, "lives": {"type": "integer"}},
                         "required": ["pet", "lives"]},
                 "Dog": {"type": "object", "properties": {"pet": {"enum": ["dog"]}, "good": {"type": "boolean"}},
                         "required": ["pet"]}}})",
       }) {
    EXPECT_EQ(rejected_at(schema), "ok") << schema << "\n" << message(schema);
  }
}

TEST(JsonSchemaCheck, NamesTheKeywordAndWhereItIs) {
  const std::string schema =
      R"({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}})";
  EXPECT_EQ(rejected_at(schema), "/properties/tags/uniqueItems");
  EXPECT_EQ(message(schema),
            "JSON schema keyword \"uniqueItems\" at /properties/tags is not supported (it would not be enforced)");
  EXPECT_EQ(message(R"({"type": "string", "maxLength": 3, "format": "date"})"),
            "JSON schema keyword \"maxLength\" at the top level is not supported together with \"format\" (it would "
            "not be enforced)");
}

TEST(JsonSchemaCheck, RejectsKeywordsXgrammarIgnores) {
  struct Case {
    const char* schema;
    const char* where;
  };
  for (const auto& c : std::initializer_list<Case>{
           // never enforced
           {R"({"type": "array", "contains": {"const": 1}})", "/contains"},
           {R"({"type": "array", "minContains": 1})", "/minContains"},
           {R"({"type": "array", "prefixItems": [{"type": "integer"}], "additionalItems": false})", "/additionalItems"},
           {R"({"type": "integer", "not": {"const": 3}})", "/not"},
           {R"({"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}})", "/if"},
           {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "dependentRequired": {"a": ["a"]}})",
            "/dependentRequired"},
           {R"({"type": "string", "contentEncoding": "base64"})", "/contentEncoding"},
           {R"({"type": "string", "nullable": true})", "/nullable"},
           // typos: an allowlist, not a denylist
           {R"({"type": "object", "properties": {"a": {"type": "string"}}, "requried": ["a"]})", "/requried"},
           {R"({"type": "object", "properties": {"a": {"type": "string", "maxLenght": 3}}})", "/properties/a/maxLenght"},
           // combinations xgrammar drops
           {R"({"type": "number", "multipleOf": 0.5})", "/multipleOf"},
           {R"({"type": "number", "multipleOf": 2})", "/multipleOf"},
           {R"({"type": "integer", "multipleOf": 1.5})", "/multipleOf"},
           {R"({"type": "integer", "multipleOf": 2048})", "/multipleOf"},
           {R"({"type": "integer", "multipleOf": 3, "minimum": 0})", "/multipleOf"},
           {R"({"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 100000})", "/multipleOf"},
           {R"({"type": "string", "format": "date", "minLength": 12})", "/minLength"},
           {R"({"type": "string", "pattern": "^a+$", "maxLength": 2})", "/maxLength"},
           {R"({"type": "string", "format": "date", "pattern": "^x$"})", "/pattern"},
           {R"({"type": "string", "format": "iri"})", "/format"},
           {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]})", "/required/1"},
           {R"({"type": "object", "additionalProperties": true, "unevaluatedProperties": false})",
            "/unevaluatedProperties"},
           {R"({"type": "array", "items": true, "unevaluatedItems": false})", "/unevaluatedItems"},
           // keywords beside the one xgrammar dispatches on
           {R"({"$defs": {"A": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/A", "minimum": 3}}})",
            "/properties/x/minimum"},
           {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "anyOf": [{"required": ["a"]}]})", "/type"},
           {R"({"anyOf": [{"type": "string"}, {"type": "integer"}], "maxLength": 2})", "/maxLength"},
           {R"({"type": "string", "enum": ["a", 1]})", "/type"},
           {R"({"type": "string", "const": "abc", "maxLength": 2})", "/maxLength"},
           {R"({"const": "a", "enum": ["b"]})", "/enum"},
           {R"({"allOf": [{"type": "integer"}, {"minimum": 0}]})", "/allOf"},
           {R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "/oneOf"},
           {R"({"oneOf": [{"type": "string", "maxLength": 2}, {"type": "string", "minLength": 1}]})", "/oneOf"},
           // type-specific keywords where xgrammar reads no type
           {R"({"minLength": 3})", "/minLength"},
           {R"({"required": ["a"]})", "/required"},
           {R"({"type": "string", "minimum": 3})", "/minimum"},
           {R"({"properties": {"a": {"type": "integer"}}, "items": {"type": "string"}})", "/items"},
           {R"({"type": "object", "propertyNames": {"$ref": "#/$defs/N"}, "$defs": {"N": {"maxLength": 3}}})",
            "/$defs/N/maxLength"},
           // $ref targets
           {R"({"properties": {"x": {"$ref": "https://example.com/s.json"}}})", "/properties/x/$ref"},
           {R"({"properties": {"x": {"$ref": "#/examples/0"}}, "examples": [{"type": "integer"}]})",
            "/properties/x/$ref"},
           {R"({"$defs": {"A": {"$id": "inner", "type": "integer"}}})", "/$defs/A/$id"},
       }) {
    EXPECT_EQ(rejected_at(c.schema), c.where) << c.schema << "\n" << message(c.schema);
  }
}

TEST(JsonSchemaCheck, RejectsWhatIsNotASchema) {
  EXPECT_EQ(rejected_at("{"), "");
  EXPECT_EQ(rejected_at("[]"), "");
  EXPECT_EQ(rejected_at("false"), "");
  EXPECT_EQ(rejected_at(R"({"type": "strnig"})"), "/type");
  EXPECT_EQ(rejected_at(R"({"type": []})"), "/type");
  EXPECT_EQ(rejected_at(R"({"properties": {"a": 3}})"), "/properties/a");
  EXPECT_EQ(rejected_at(R"({"properties": []})"), "/properties");
  EXPECT_EQ(rejected_at(R"({"enum": []})"), "/enum");
  EXPECT_EQ(rejected_at(R"({"anyOf": []})"), "/anyOf");
  EXPECT_NE(message("{").find("not valid JSON"), std::string::npos);
}

TEST(JsonSchemaCheck, PropertyNamesAndDataAreNotKeywords) {
  // Property names may be spelled like keywords; enum, const, default and examples hold data.
  EXPECT_EQ(rejected_at(R"({"type": "object", "properties": {"not": {"type": "integer"}, "uniqueItems": {"type":
                           "boolean"}, "a/b": {"type": "string"}}, "required": ["not", "a/b"]})"),
            "ok");
  EXPECT_EQ(rejected_at(R"({"enum": [{"uniqueItems": true}], "default": {"contains": 1},
                           "examples": [{"if": 1}]})"),
            "ok");
  // ...and a pointer escapes them (RFC 6901).
  EXPECT_EQ(rejected_at(R"({"type": "object", "properties": {"a/b~c": {"type": "string", "foo": 1}}})"),
            "/properties/a~1b~0c/foo");
}

TEST(JsonSchemaCheck, RejectsDeepNesting) {
  std::string schema;
  for (int i = 0; i < 300; ++i) schema += R"({"type": "array", "items": )";
  schema += "true";
  for (int i = 0; i < 300; ++i) schema += "}";
  EXPECT_THROW(check_json_schema(schema), InvalidGrammar);
}

TEST(StrictDateFormats, FormatsBecomePatternsAndDataIsLeftAlone) {
  const auto out = nlohmann::json::parse(kestrel::runtime::with_bounded_formats(
      R"({"type":"object","properties":{"d":{"type":"string","format":"date"},"t":{"type":"string","format":"date-time"},
          "e":{"type":"string","format":"uri"}},"default":{"format":"date"},"enum":[{"format":"time"}]})"));
  const auto& p = out.at("properties");
  EXPECT_FALSE(p.at("d").contains("format"));
  EXPECT_NE(p.at("d").at("pattern").get<std::string>().find("02-(0[1-9]|1[0-9]|2[0-8])"), std::string::npos);
  EXPECT_NE(p.at("t").at("pattern").get<std::string>().find("T([01][0-9]|2[0-3])"), std::string::npos);
  EXPECT_EQ(p.at("e").at("format"), "uri");
  EXPECT_EQ(out.at("default").at("format"), "date");
  EXPECT_EQ(out.at("enum")[0].at("format"), "time");
  // a property named like a data keyword is still a schema
  const auto named = nlohmann::json::parse(kestrel::runtime::with_bounded_formats(
      R"({"type":"object","properties":{"enum":{"type":"string","format":"date"}}})"));
  EXPECT_TRUE(named.at("properties").at("enum").contains("pattern"));
}
