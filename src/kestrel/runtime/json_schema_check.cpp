// check_json_schema: the JSON Schema keywords Kestrel enforces, as an allowlist.
//
// xgrammar compiles a schema into a grammar, but it drops what it cannot express with at most a
// log line: unknown keywords, uniqueItems, contains, not, if/then/else, multipleOf on numbers,
// string lengths next to a pattern or format, keywords beside $ref/anyOf/allOf (its parser
// takes one of $ref, const, enum, anyOf, oneOf, allOf, type, in that order, and ignores the
// rest), allOf with more than one schema, required names that are not properties, and oneOf
// branches it cannot prove disjoint (enforced as anyOf). A request must never get an answer that
// silently ignores part of its schema, so this walk accepts only what xgrammar 0.2.8 was shown to
// enforce: tests/python/test_json_schema_keywords.py compiles a schema for each accepted keyword
// and checks that xgrammar rejects an instance that violates it. docs/json-schema-keywords.md
// lists the keywords.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/runtime/grammar.h"

namespace kestrel::runtime {

namespace {

using Json = nlohmann::ordered_json;  // document order, so the first offending keyword is named

// JSON Schema's instance types; integer is a subset of number.
enum Type : unsigned { kNull = 1, kBoolean = 2, kObject = 4, kArray = 8, kNumber = 16, kString = 32, kInteger = 64 };
constexpr unsigned kAnyType = kNull | kBoolean | kObject | kArray | kNumber | kString | kInteger;

constexpr int kMaxDepth = 128;  // the walk and xgrammar's parser both recurse per level

// Keywords that only annotate: accepted anywhere, never walked. "discriminator" is OpenAPI's
// (pydantic writes it next to oneOf); the oneOf branches carry the constraint.
bool is_annotation(std::string_view key) {
  static const std::set<std::string_view> kKeys = {"title",   "description", "examples",  "default",       "$comment",
                                                   "$schema", "deprecated",  "readOnly",  "writeOnly",     "discriminator"};
  return kKeys.count(key) != 0;
}

// The instance types a type-specific keyword constrains, and xgrammar enforces it for. Only
// multipleOf differs between the two: it constrains numbers too, but xgrammar ignores it there.
struct TypeKeyword {
  std::string_view name;
  unsigned applies;
};
constexpr TypeKeyword kTypeKeywords[] = {
    {"minimum", kNumber | kInteger},
    {"maximum", kNumber | kInteger},
    {"exclusiveMinimum", kNumber | kInteger},
    {"exclusiveMaximum", kNumber | kInteger},
    {"multipleOf", kNumber | kInteger},
    {"minLength", kString},
    {"maxLength", kString},
    {"pattern", kString},
    {"format", kString},
    {"properties", kObject},
    {"required", kObject},
    {"additionalProperties", kObject},
    {"unevaluatedProperties", kObject},
    {"patternProperties", kObject},
    {"propertyNames", kObject},
    {"minProperties", kObject},
    {"maxProperties", kObject},
    {"items", kArray},
    {"prefixItems", kArray},
    {"unevaluatedItems", kArray},
    {"minItems", kArray},
    {"maxItems", kArray},
    {"uniqueItems", kArray},
};

const TypeKeyword* type_keyword(std::string_view key) {
  for (const auto& k : kTypeKeywords) {
    if (k.name == key) return &k;
  }
  return nullptr;
}

// The formats xgrammar turns into a regular expression (JSONSchemaConverter's format table);
// any other format is ignored.
bool is_builtin_format(std::string_view format) {
  static const std::set<std::string_view> kFormats = {
      "date",     "time", "date-time", "duration", "email",         "hostname",     "ipv4",
      "ipv6",     "uuid", "uri",       "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"};
  return kFormats.count(format) != 0;
}

std::optional<unsigned> type_bit(const std::string& name) {
  if (name == "null") return kNull;
  if (name == "boolean") return kBoolean;
  if (name == "object") return kObject;
  if (name == "array") return kArray;
  if (name == "number") return kNumber;
  if (name == "string") return kString;
  if (name == "integer") return kInteger;
  return std::nullopt;
}

// The type of a value, as a set so that 1 counts as both integer and number.
unsigned value_types(const Json& v) {
  if (v.is_null()) return kNull;
  if (v.is_boolean()) return kBoolean;
  if (v.is_object()) return kObject;
  if (v.is_array()) return kArray;
  if (v.is_string()) return kString;
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::isfinite(d) && std::floor(d) == d ? kNumber | kInteger : kNumber;
  }
  return kNumber | kInteger;
}

// integer and number overlap.
bool types_overlap(unsigned a, unsigned b) {
  const auto widen = [](unsigned t) { return (t & (kNumber | kInteger)) != 0 ? t | kNumber | kInteger : t; };
  return (widen(a) & widen(b)) != 0;
}

std::string escape_pointer_token(const std::string& key) {
  std::string out;
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string at(const std::string& pointer) { return pointer.empty() ? "the top level" : pointer; }

class SchemaChecker {
 public:
  explicit SchemaChecker(const Json& root) : root_(root) {}

  void run() {
    walk(root_, "", 0, 0);
    // xgrammar parses a $ref's target on its own, without the type a propertyNames context
    // implies; the target must be a schema this walk checked that way.
    for (const auto& [uri, where] : refs_) {
      if (checked_.count(ref_pointer(uri)) == 0) {
        throw InvalidGrammar("JSON schema $ref \"" + uri + "\" at " + at(where) + " does not point at a schema", where + "/$ref");
      }
    }
  }

 private:
  [[noreturn]] static void unsupported(const std::string& pointer, const std::string& key, const std::string& why = "",
                                       const std::string& consequence = "it would not be enforced") {
    throw InvalidGrammar("JSON schema keyword \"" + key + "\" at " + at(pointer) + " is not supported" + why + " (" +
                             consequence + ")",
                         pointer + "/" + escape_pointer_token(key));
  }

  [[noreturn]] static void invalid(const std::string& pointer, const std::string& key, const std::string& what) {
    throw InvalidGrammar("JSON schema keyword \"" + key + "\" at " + at(pointer) + " " + what,
                         pointer + "/" + escape_pointer_token(key));
  }

  // xgrammar resolves "#/a/b" by object keys split at '/' (empty ones skipped, no ~ or %
  // unescaping), and "#" to the root.
  static std::vector<std::string> ref_keys(const std::string& uri) {
    std::vector<std::string> keys;
    size_t start = 2;
    while (start <= uri.size()) {
      const size_t end = std::min(uri.find('/', start), uri.size());
      if (end > start) keys.push_back(uri.substr(start, end - start));
      start = end + 1;
    }
    return keys;
  }

  static std::string ref_pointer(const std::string& uri) {
    std::string pointer;
    for (const auto& key : ref_keys(uri)) {
      pointer += '/';
      pointer += escape_pointer_token(key);
    }
    return pointer;
  }

  const Json* resolve(const std::string& uri) const {
    const Json* node = &root_;
    for (const auto& key : ref_keys(uri)) {
      if (!node->is_object() || !node->contains(key)) return nullptr;
      node = &node->at(key);
    }
    return node;
  }

  // `implied`: the type xgrammar assumes when the schema names none (string for propertyNames).
  void walk(const Json& schema, const std::string& pointer, unsigned implied, int depth) {
    if (depth > kMaxDepth) throw InvalidGrammar("the JSON schema is nested too deeply", pointer);
    if (schema.is_boolean()) return;  // true: any value; false: xgrammar reports it unsatisfiable
    if (!schema.is_object()) {
      throw InvalidGrammar("a JSON schema at " + at(pointer) + " must be an object or a boolean", pointer);
    }
    if (implied == 0) checked_.insert(pointer);

    // The one keyword xgrammar's parser dispatches on; the others it reads only for a type.
    std::string dispatch;
    for (const char* k : {"$ref", "const", "enum", "anyOf", "oneOf", "allOf"}) {
      if (schema.contains(k)) {
        dispatch = k;
        break;
      }
    }
    unsigned types = 0;
    bool explicit_type = false;
    if (dispatch.empty()) {
      if (schema.contains("type")) {
        types = parse_type(schema.at("type"), pointer);
        explicit_type = true;
      } else if (schema.contains("properties") || schema.contains("additionalProperties") ||
                 schema.contains("unevaluatedProperties")) {
        types = kObject;
      } else if (schema.contains("items") || schema.contains("prefixItems") || schema.contains("unevaluatedItems")) {
        types = kArray;
      } else {
        types = implied;
      }
    }

    for (const auto& [key, value] : schema.items()) {
      if (is_annotation(key)) continue;
      if (key == "$id") {
        // A nested $id would rebase the $refs under it; xgrammar resolves them all from the root.
        if (!pointer.empty()) unsupported(pointer, key, " below the top level");
        continue;
      }
      if (key == "$defs" || key == "definitions") {
        if (!value.is_object()) invalid(pointer, key, "must be an object of schemas");
        for (const auto& [name, sub] : value.items()) walk(sub, pointer + "/" + key + "/" + escape_pointer_token(name), 0, depth + 1);
        continue;
      }
      if (key == dispatch) {
        check_dispatch(schema, key, value, pointer, depth);
        continue;
      }
      if (key == "type") {
        if (dispatch == "const" || dispatch == "enum") {
          check_type_of_values(schema, dispatch, pointer);
          continue;
        }
        if (!dispatch.empty()) unsupported(pointer, key, " together with \"" + dispatch + "\"");
        continue;  // the dispatch
      }
      if (!dispatch.empty()) {
        if (type_keyword(key) != nullptr || key == "const" || key == "enum" || key == "anyOf" || key == "oneOf" ||
            key == "allOf") {
          unsupported(pointer, key, " together with \"" + dispatch + "\"");
        }
        unsupported(pointer, key);
      }
      const TypeKeyword* tk = type_keyword(key);
      if (tk == nullptr) unsupported(pointer, key);
      if ((tk->applies & types) == 0) {
        unsupported(pointer, key, explicit_type ? " for " + describe_types(types) : " without \"type\"");
      }
      check_type_keyword(schema, key, value, types, pointer, depth);
    }
  }

  static unsigned parse_type(const Json& type, const std::string& pointer) {
    const auto bit = [](const Json& t) { return t.is_string() ? type_bit(t.get<std::string>()) : std::nullopt; };
    unsigned types = 0;
    if (type.is_string()) {
      types = bit(type).value_or(0);
    } else if (type.is_array() && !type.empty()) {
      for (const auto& t : type) types |= bit(t).value_or(kAnyType + 1);
    }
    if (types == 0 || (types & ~kAnyType) != 0) {
      invalid(pointer, "type",
              "must be one of null, boolean, object, array, number, string, integer, or a non-empty array of them");
    }
    return types;
  }

  static std::string describe_types(unsigned types) {
    std::string out;
    for (const char* name : {"null", "boolean", "object", "array", "number", "string", "integer"}) {
      if ((types & *type_bit(name)) == 0) continue;
      out += out.empty() ? "type \"" : ", \"";
      out += name;
      out += "\"";
    }
    return out;
  }

  // "type" beside const or enum: xgrammar emits the listed values whatever the type says, so
  // the type must already admit each of them.
  static void check_type_of_values(const Json& schema, const std::string& dispatch, const std::string& pointer) {
    const unsigned types = parse_type(schema.at("type"), pointer);
    const Json& data = schema.at(dispatch);
    const auto admits = [&](const Json& v) { return (value_types(v) & types) != 0; };
    if (dispatch == "const" ? !admits(data) : data.is_array() && !std::all_of(data.begin(), data.end(), admits)) {
      unsupported(pointer, "type", " together with \"" + dispatch + "\" values it excludes");
    }
  }

  void check_dispatch(const Json& schema, const std::string& key, const Json& value, const std::string& pointer, int depth) {
    if (key == "const") return;  // data
    if (key == "enum") {
      if (!value.is_array() || value.empty()) invalid(pointer, key, "must be a non-empty array");
      return;
    }
    if (key == "$ref") {
      if (!value.is_string()) invalid(pointer, key, "must be a string");
      const auto uri = value.get<std::string>();
      if (uri != "#" && uri.rfind("#/", 0) != 0) {
        unsupported(pointer, key, " with \"" + uri + "\"", "only \"#\" and \"#/...\" references within the schema are");
      }
      refs_.emplace_back(uri, pointer);
      return;
    }
    // anyOf, oneOf, allOf
    if (!value.is_array() || value.empty()) invalid(pointer, key, "must be a non-empty array of schemas");
    if (key == "allOf" && value.size() != 1) unsupported(pointer, key, " with more than one schema");
    for (size_t i = 0; i < value.size(); ++i) walk(value[i], pointer + "/" + key + "/" + std::to_string(i), 0, depth + 1);
    if (key == "oneOf") check_disjoint(schema.at(key), pointer);
  }

  void check_type_keyword(const Json& schema, const std::string& key, const Json& value, unsigned types,
                          const std::string& pointer, int depth) {
    const std::string here = pointer + "/" + key;
    if (key == "multipleOf") {
      check_multiple_of(schema, value, types, pointer);
    } else if (key == "minLength" || key == "maxLength") {
      // A pattern or a format becomes the whole string rule; the lengths are dropped.
      for (const char* other : {"pattern", "format"}) {
        if (schema.contains(other)) unsupported(pointer, key, std::string(" together with \"") + other + "\"");
      }
    } else if (key == "format") {
      if (!value.is_string()) invalid(pointer, key, "must be a string");
      if (!is_builtin_format(value.get<std::string>())) {
        unsupported(pointer, key, " with \"" + value.get<std::string>() + "\"");
      }
      if (schema.contains("pattern")) unsupported(pointer, "pattern", " together with \"format\"");
    } else if (key == "properties" || key == "patternProperties") {
      if (!value.is_object()) invalid(pointer, key, "must be an object of schemas");
      for (const auto& [name, sub] : value.items()) walk(sub, here + "/" + escape_pointer_token(name), 0, depth + 1);
    } else if (key == "required") {
      if (!value.is_array()) invalid(pointer, key, "must be an array of property names");
      const Json* properties = schema.contains("properties") ? &schema.at("properties") : nullptr;
      for (size_t i = 0; i < value.size(); ++i) {
        if (!value[i].is_string()) invalid(pointer, key, "must be an array of property names");
        const auto name = value[i].get<std::string>();
        if (properties == nullptr || !properties->is_object() || !properties->contains(name)) {
          // xgrammar only requires listed properties; an unlisted required name is dropped.
          throw InvalidGrammar("JSON schema keyword \"required\" at " + at(pointer) + " names \"" + name +
                                   "\", which is not in \"properties\" (it would not be enforced)",
                               here + "/" + std::to_string(i));
        }
      }
    } else if (key == "additionalProperties" || key == "items" || key == "unevaluatedProperties" ||
               key == "unevaluatedItems") {
      if (key == "unevaluatedProperties" && schema.contains("additionalProperties")) {
        unsupported(pointer, key, " together with \"additionalProperties\"");
      }
      if (key == "unevaluatedItems" && schema.contains("items")) unsupported(pointer, key, " together with \"items\"");
      if (!value.is_boolean() && !value.is_object()) invalid(pointer, key, "must be a schema (an object or a boolean)");
      walk(value, here, 0, depth + 1);
    } else if (key == "propertyNames") {
      walk(value, here, kString, depth + 1);
    } else if (key == "prefixItems") {
      if (!value.is_array()) invalid(pointer, key, "must be an array of schemas");
      for (size_t i = 0; i < value.size(); ++i) walk(value[i], here + "/" + std::to_string(i), 0, depth + 1);
    } else if (key == "uniqueItems") {
      if (value != Json(false)) unsupported(pointer, key);
    }
    // minimum, maximum, exclusive*, pattern, min/maxProperties, min/maxItems: xgrammar checks
    // their values itself.
  }

  // xgrammar enforces multipleOf for integers only: a whole number from 1 to 1024, with no bound
  // or with both bounds at most 10,000 apart.
  static void check_multiple_of(const Json& schema, const Json& value, unsigned types, const std::string& pointer) {
    if ((types & kNumber) != 0) unsupported(pointer, "multipleOf", " for type \"number\"");
    if (!value.is_number()) invalid(pointer, "multipleOf", "must be a number");
    const double m = value.get<double>();
    if (!(m >= 1 && m <= 1024 && std::floor(m) == m)) {
      unsupported(pointer, "multipleOf", " with " + value.dump() + "; only whole numbers from 1 to 1024 are");
    }
    std::optional<double> low, high;
    for (const char* k : {"minimum", "exclusiveMinimum"}) {
      if (schema.contains(k) && schema.at(k).is_number()) {
        const double v = schema.at(k).get<double>() + (k[0] == 'e' ? 1 : 0);
        low = low ? std::max(*low, v) : v;
      }
    }
    for (const char* k : {"maximum", "exclusiveMaximum"}) {
      if (schema.contains(k) && schema.at(k).is_number()) {
        const double v = schema.at(k).get<double>() - (k[0] == 'e' ? 1 : 0);
        high = high ? std::min(*high, v) : v;
      }
    }
    if (low.has_value() != high.has_value()) {
      unsupported(pointer, "multipleOf", " with only one bound");
    }
    if (low && *high - *low + 1 > 10000) {
      unsupported(pointer, "multipleOf", " over a range of more than 10,000 integers");
    }
  }

  // What a oneOf branch may produce, for the disjointness proof.
  struct Branch {
    unsigned types = kAnyType;
    std::optional<std::vector<Json>> values;  // const or enum
    const Json* object = nullptr;             // an object schema with properties and required
  };

  Branch classify(const Json* schema) const {
    for (int hops = 0; hops < 32 && schema != nullptr && schema->is_object() && schema->contains("$ref"); ++hops) {
      const auto& ref = schema->at("$ref");
      schema = ref.is_string() ? resolve(ref.get<std::string>()) : nullptr;
    }
    Branch b;
    if (schema == nullptr || !schema->is_object()) return b;
    const Json& s = *schema;
    if (s.contains("$ref")) return b;
    if (s.contains("const") || s.contains("enum")) {
      std::vector<Json> values;
      if (s.contains("const")) {
        values.push_back(s.at("const"));
      } else if (s.at("enum").is_array()) {
        values.assign(s.at("enum").begin(), s.at("enum").end());
      } else {
        return b;
      }
      b.types = 0;
      for (const auto& v : values) b.types |= value_types(v);
      b.values = std::move(values);
      return b;
    }
    if (s.contains("anyOf") || s.contains("oneOf") || s.contains("allOf")) return b;
    if (s.contains("type")) {
      b.types = 0;
      const auto add = [&](const Json& t) {
        const auto bit = t.is_string() ? type_bit(t.get<std::string>()) : std::nullopt;
        b.types |= bit ? *bit : kAnyType;
      };
      if (s.at("type").is_array()) {
        for (const auto& t : s.at("type")) add(t);
      } else {
        add(s.at("type"));
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("unevaluatedProperties")) {
      b.types = kObject;
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("unevaluatedItems")) {
      b.types = kArray;
    }
    if (b.types == kObject && s.contains("properties") && s.contains("required")) b.object = &s;
    return b;
  }

  static bool values_overlap(const std::vector<Json>& a, const std::vector<Json>& b) {
    for (const auto& x : a) {
      for (const auto& y : b) {
        if (x == y) return true;
      }
    }
    return false;
  }

  static bool values_overlap_types(const std::vector<Json>& values, unsigned types) {
    return std::any_of(values.begin(), values.end(), [&](const Json& v) { return types_overlap(value_types(v), types); });
  }

  // A property both branches require, with const/enum values that differ.
  bool discriminated(const Branch& a, const Branch& b) const {
    if (a.object == nullptr || b.object == nullptr) return false;
    const auto property = [&](const Json& s, const std::string& name) -> std::optional<Branch> {
      const auto& req = s.at("required");
      const auto& props = s.at("properties");
      if (!req.is_array() || !props.is_object() || !props.contains(name)) return std::nullopt;
      if (std::find(req.begin(), req.end(), Json(name)) == req.end()) return std::nullopt;
      auto branch = classify(&props.at(name));
      if (!branch.values) return std::nullopt;
      return branch;
    };
    if (!a.object->at("properties").is_object()) return false;
    for (const auto& item : a.object->at("properties").items()) {
      const auto pa = property(*a.object, item.key());
      const auto pb = property(*b.object, item.key());
      if (pa && pb && !values_overlap(*pa->values, *pb->values)) return true;
    }
    return false;
  }

  bool disjoint(const Branch& a, const Branch& b) const {
    if (!types_overlap(a.types, b.types)) return true;
    if (a.values && b.values) return !values_overlap(*a.values, *b.values);
    if (a.values) return !values_overlap_types(*a.values, b.types);
    if (b.values) return !values_overlap_types(*b.values, a.types);
    return discriminated(a, b);
  }

  // xgrammar enforces oneOf exactly only when it can prove the branches disjoint, and as anyOf
  // otherwise; the two agree whenever the branches are disjoint, which this proves (by type, by
  // const/enum values, or by a required discriminator property), following $refs.
  void check_disjoint(const Json& options, const std::string& pointer) const {
    std::vector<Branch> branches;
    for (const auto& option : options) branches.push_back(classify(&option));
    for (size_t i = 0; i < branches.size(); ++i) {
      for (size_t j = i + 1; j < branches.size(); ++j) {
        if (!disjoint(branches[i], branches[j])) {
          unsupported(pointer, "oneOf",
                      " with branches " + std::to_string(i) + " and " + std::to_string(j) +
                          " that may overlap (use anyOf, or tell them apart by type, const or enum)",
                      "it would be enforced as anyOf");
        }
      }
    }
  }

  const Json& root_;
  std::set<std::string> checked_;                               // pointers of schemas walked with no implied type
  std::vector<std::pair<std::string, std::string>> refs_;       // $ref uri, pointer of its schema
};

}  // namespace

void check_json_schema(const std::string& schema) {
  const auto doc = Json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw InvalidGrammar("the JSON schema is not valid JSON");
  if (!doc.is_object() && doc != Json(true)) throw InvalidGrammar("a JSON schema must be an object (or true)");
  SchemaChecker(doc).run();
}

}  // namespace kestrel::runtime
