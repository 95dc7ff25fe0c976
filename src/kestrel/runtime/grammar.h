// Structured output: constraints that decide, token by token, which tokens may come next
// (JSON Schema, any JSON object, a regular expression, an EBNF/GBNF or Lark grammar).
//
// The grammars are compiled and matched by xgrammar's C++ core (Apache-2.0; Dong et al. 2024,
// arXiv 2411.15100), built from its PyPI source distribution by scripts/build_xgrammar.sh. Only
// this file's .cpp sees xgrammar; docs/structured-output.md says what is enforced and how the
// masks meet FlashHead's candidate sets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/runtime/sampler.h"
#include "kestrel/text/tokenizer.h"

namespace kestrel::runtime {

/// A grammar, schema or pattern that does not compile, or a JSON Schema keyword that is not
/// enforced. `where()` names the offending keyword or JSON pointer when one is known.
class InvalidGrammar : public Error {
 public:
  InvalidGrammar(const std::string& message, std::string where = "") : Error(message), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

/// What a generation's output must match.
struct GrammarSpec {
  enum class Kind {
    kJsonSchema,  // text: a JSON Schema document
    kJsonObject,  // any JSON object (OpenAI's response_format json_object); text unused
    kRegex,       // text: a regular expression the whole answer matches
    kEbnf,        // text: a GBNF/EBNF grammar (llama.cpp's GBNF syntax), root rule "root"
    kLark,        // text: a Lark grammar, root rule "start"
    kStructuralTag,  // text: an xgrammar structural tag ({"type": "structural_tag", "format": ...})
  };
  Kind kind = Kind::kJsonObject;
  std::string text;
  /// JSON Schema only: no properties or items beyond those the schema lists (OpenAI's strict
  /// mode and additionalProperties false by default), as xgrammar's strict_mode.
  bool strict = true;
  /// Match against a second vocabulary in which control tokens (Gemma 4's <|tool_call>,
  /// <|"|>, ...) are their piece text instead of never allowed, so that a grammar can emit
  /// them: by text, or exactly with xgrammar's Token(id). Stop, unknown and unused tokens stay
  /// as in the first. Built on first use (one more xgrammar vocabulary and compiler cache).
  bool control_tokens_as_text = false;
};

/// The largest schema or grammar text compiled (bytes): compiling time and memory grow with it
/// (xgrammar took minutes and gigabytes on a 1.3 MB schema of 15,000 optional properties).
inline constexpr size_t kMaxGrammarBytes = 64 * 1024;

/// A compiled grammar: shared, read-only, for any number of generations.
class CompiledGrammar;

/// Compiles grammars for one vocabulary. The vocabulary is the tokenizer's, decoded as the
/// detokenizer decodes it (U+2581 as a space, <0xXX> as a byte); control, unknown and unused
/// tokens are never allowed by a grammar (unless GrammarSpec::control_tokens_as_text);
/// `stop_tokens` are allowed exactly where the grammar may end. Compiled grammars are cached (same spec: same result). Thread-safe.
class GrammarCompiler {
 public:
  GrammarCompiler(const text::Tokenizer& tokenizer, std::vector<TokenId> stop_tokens, int n_threads);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  /// Throws InvalidGrammar when the spec does not compile (naming the reason), is longer than
  /// kMaxGrammarBytes, matches no text at all, or is a JSON Schema with a keyword that would
  /// not be enforced (check_json_schema).
  std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec);
  /// The grammar compile() compiles, as EBNF text (xgrammar's syntax, root rule "root"): for
  /// tests that compare the masks with another build of the library. Throws as compile().
  std::string ebnf(const GrammarSpec& spec);


 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  size_t n_vocab_ = 0;
};

/// Throws InvalidGrammar naming the first keyword of `schema` (JSON text) that Kestrel does not
/// enforce, with its JSON pointer, or when `schema` is not a JSON object (or true). Keywords
/// that only annotate (title, description, examples, default, $comment, ...) are accepted.
void check_json_schema(const std::string& schema);

/// `schema` (JSON text) with every `"format": "date"`, `"date-time"` or `"time"` replaced by a
/// `"pattern"` that admits only valid values of RFC 3339's full-date / date-time / full-time
/// (years 0001-9999, days that exist in their month, February up to the 28th; hours 00-23,
/// seconds 00-59, fractions of up to 6 digits, Z or an offset): xgrammar's own formats check
/// the shape only (2021-02-31 passes) while JSON Schema's formats are RFC 3339's. A strict
/// subset: every answer validates. `"format": "email"` likewise becomes a pattern of bounded
/// length (atoms of at most 32 characters, labels of at most 32, up to four of each). Values of
/// enum, const, default and examples are left alone.
std::string with_bounded_formats(const std::string& schema);

/// One generation's position in a compiled grammar: which tokens may come next, and the
/// tokens accepted so far. Not thread-safe (one per generation).
class TokenConstraint {
 public:
  explicit TokenConstraint(std::shared_ptr<const CompiledGrammar> grammar);
  ~TokenConstraint();
  TokenConstraint(TokenConstraint&&) noexcept;

  /// Computes the set of tokens allowed next (the mask) and returns how many there are.
  /// Call after each accept() and before allowed() / apply(). 0 once terminated.
  size_t update();
  /// True when `token` may come next (as of the last update()).
  bool allowed(TokenId token) const;
  /// The allowed tokens in id order (as of the last update()).
  void allowed_tokens(std::vector<TokenId>& out) const;
  /// Sets the logits of the tokens not allowed to -inf (dense or sparse scores) and returns
  /// how many scores remain finite-or-allowed, i.e. allowed.
  size_t apply(TokenScores scores) const;
  /// Advances past `token`. Returns false (and changes nothing) when it was not allowed.
  bool accept(TokenId token);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel::runtime
