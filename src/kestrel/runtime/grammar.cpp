#include "kestrel/runtime/grammar.h"

#include <bit>
#include <cmath>
#include <exception>
#include <utility>
#include <variant>

#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

namespace kestrel::runtime {

class CompiledGrammar {
 public:
  CompiledGrammar(xgrammar::CompiledGrammar g, size_t n) : grammar(std::move(g)), n_vocab(n) {}
  xgrammar::CompiledGrammar grammar;
  size_t n_vocab;
};

namespace {

// The bytes each token stands for, as the detokenizer writes them (text::Tokenizer::
// token_to_piece); "" for control, unknown and unused tokens, which xgrammar then treats as
// special (never allowed by a grammar). With `control_as_text`, control tokens are their piece
// text (as the detokenizer renders them with render_special). Stop tokens are xgrammar's stop
// tokens either way. Given to xgrammar as a RAW vocabulary: no decoding.
std::vector<std::string> token_bytes(const text::Tokenizer& tokenizer, bool control_as_text) {
  std::vector<std::string> vocab(tokenizer.n_vocab());
  for (size_t i = 0; i < vocab.size(); ++i) {
    const auto id = static_cast<TokenId>(i);
    const auto type = tokenizer.type(id);
    if (type == text::TokenType::kControl && control_as_text) {
      vocab[i] = tokenizer.token_to_piece(id, true);
      continue;
    }
    if (type == text::TokenType::kControl || type == text::TokenType::kUnknown || type == text::TokenType::kUnused) {
      continue;
    }
    vocab[i] = tokenizer.token_to_piece(id);
  }
  return vocab;
}

// xgrammar reports a bad grammar or schema by throwing (std::runtime_error or its
// XGrammarError); its messages name the rule or keyword.
template <typename F>
auto compiled(const char* what, F&& f) {
  try {
    return f();
  } catch (const InvalidGrammar&) {
    throw;
  } catch (const std::exception& e) {
    // xgrammar's messages start "[hh:mm:ss] /path/file.cc:123: ", which says nothing to a client.
    std::string message = e.what();
    if (const size_t cc = message.find(".cc:"); !message.empty() && message[0] == '[' && cc != std::string::npos) {
      if (const size_t colon = message.find(": ", cc); colon != std::string::npos) message.erase(0, colon + 2);
    }
    while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
    throw InvalidGrammar(std::string("invalid ") + what + ": " + message);
  }
}

// Numbers in a JSON Schema grammar get at most 16 digits before the decimal point and 16 after
// it, as llama.cpp's json-schema-to-grammar writes them (integral part [1-9][0-9]{0,15},
// decimal part [0-9]{1,16}): a small model may otherwise write digits until max_tokens. Works on
// xgrammar's printed EBNF (rule shapes as of 0.2.8): an unbounded run of digits is either
// `[1-9] [0-9]*` or a repetition `D{1, -1}` / `D{0, -1}` of a rule `D ::= (([0-9]))`; each gets
// an upper bound of 15 (after a leading [1-9]) or 16. A digit-only pattern of the user's, e.g.
// "[1-9][0-9]*", is bounded the same way; every answer still validates.
// tests/python/test_grammar.py compiles the result in xgrammar's Python package.
std::string bound_number_digits(std::string ebnf) {
  auto replace_all = [&](std::string_view from, std::string_view to) {
    for (size_t at = ebnf.find(from); at != std::string::npos; at = ebnf.find(from, at + to.size())) {
      ebnf.replace(at, from.size(), to);
    }
  };
  replace_all("[1-9] [0-9]*", "[1-9] [0-9]{0,15}");
  // Rules that are one digit.
  std::vector<std::string> digit_rules;
  for (size_t line = 0; line < ebnf.size();) {
    const size_t end = std::min(ebnf.find('\n', line), ebnf.size());
    const std::string_view text(ebnf.data() + line, end - line);
    constexpr std::string_view kDigit = " ::= (([0-9]))";
    if (text.size() > kDigit.size() && text.substr(text.size() - kDigit.size()) == kDigit) {
      digit_rules.emplace_back(text.substr(0, text.size() - kDigit.size()));
    }
    line = end + 1;
  }
  for (const auto& rule : digit_rules) {
    replace_all(rule + "{1, -1}", rule + "{1, 16}");
    replace_all(rule + "{0, -1}", rule + "{0, 16}");
  }
  return ebnf;
}

}  // namespace

// One xgrammar vocabulary and its compiler (with its cache of compiled grammars).
struct Vocabulary {
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;
  Vocabulary(const text::Tokenizer& tokenizer, bool control_as_text, const std::vector<TokenId>& stop_tokens,
             int n_threads)
      : info(token_bytes(tokenizer, control_as_text), xgrammar::VocabType::RAW, std::nullopt, stop_tokens, false),
        compiler(info, std::max(1, n_threads)) {}
};

struct GrammarCompiler::Impl {
  const text::Tokenizer& tokenizer;
  std::vector<TokenId> stop_tokens;
  int n_threads;
  Vocabulary plain;
  std::unique_ptr<Vocabulary> control_as_text;  // built on first use
  std::mutex mutex;  // xgrammar's compiler is thread-safe; compile() is serialized to bound memory and threads
  Impl(const text::Tokenizer& tok, std::vector<TokenId> stop, int threads)
      : tokenizer(tok), stop_tokens(std::move(stop)), n_threads(threads), plain(tok, false, stop_tokens, threads) {}
  xgrammar::GrammarCompiler& compiler(bool with_control_text) {
    if (!with_control_text) return plain.compiler;
    if (!control_as_text) control_as_text = std::make_unique<Vocabulary>(tokenizer, true, stop_tokens, n_threads);
    return control_as_text->compiler;
  }
};

GrammarCompiler::GrammarCompiler(const text::Tokenizer& tokenizer, std::vector<TokenId> stop_tokens, int n_threads)
    : impl_(std::make_unique<Impl>(tokenizer, std::move(stop_tokens), n_threads)), n_vocab_(tokenizer.n_vocab()) {}

GrammarCompiler::~GrammarCompiler() = default;

namespace {

// The xgrammar grammar of a spec, with Kestrel's edits for JSON (grammar.h, GrammarSpec).
xgrammar::Grammar grammar_of(const GrammarSpec& spec) {
  using Kind = GrammarSpec::Kind;
  // Compact JSON (", " and ": " separators, no free whitespace): a small model given free
  // whitespace can emit newlines forever; the answer parses the same.
  auto json = [](const std::string& schema, bool strict) {
    const auto grammar = xgrammar::Grammar::FromJSONSchema(schema, /*any_whitespace=*/false, std::nullopt,
                                                           std::nullopt, strict);
    return xgrammar::Grammar::FromEBNF(bound_number_digits(grammar.ToString()), "root");
  };
  switch (spec.kind) {
    case Kind::kJsonSchema:
      check_json_schema(spec.text);
      return compiled("JSON schema", [&] { return json(with_bounded_formats(spec.text), spec.strict); });
    case Kind::kJsonObject:
      return compiled("JSON schema", [&] { return json(R"({"type": "object"})", false); });
    case Kind::kRegex:
      return compiled("regular expression", [&] { return xgrammar::Grammar::FromRegex(spec.text); });
    case Kind::kEbnf:
      return compiled("grammar", [&] { return xgrammar::Grammar::FromEBNF(spec.text, "root"); });
    case Kind::kLark:
      return compiled("Lark grammar", [&] { return xgrammar::Grammar::FromLark(spec.text); });
    case Kind::kStructuralTag:
      return compiled("structural tag", [&] {
        auto tag = xgrammar::Grammar::FromStructuralTag(spec.text);
        if (const auto* error = std::get_if<xgrammar::StructuralTagError>(&tag)) {
          std::visit([](const auto& e) { throw InvalidGrammar(std::string("invalid structural tag: ") + e.what()); },
                     *error);
        }
        // Its JSON parts (tool-call arguments) get the digit bounds too.
        return xgrammar::Grammar::FromEBNF(bound_number_digits(std::get<xgrammar::Grammar>(tag).ToString()), "root");
      });
  }
  throw InvalidGrammar("unknown grammar kind");
}

}  // namespace

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) {
  if (spec.text.size() > kMaxGrammarBytes) {
    throw InvalidGrammar("the schema or grammar has " + std::to_string(spec.text.size()) + " bytes; at most " +
                         std::to_string(kMaxGrammarBytes) + " are compiled (compiling grows with its size)");
  }
  const xgrammar::Grammar grammar = grammar_of(spec);
  std::shared_ptr<const CompiledGrammar> result;
  {
    std::lock_guard lock(impl_->mutex);
    auto& compiler = impl_->compiler(spec.control_tokens_as_text);
    result = std::make_shared<const CompiledGrammar>(
        compiled("grammar", [&] { return compiler.CompileGrammar(grammar); }), n_vocab_);
  }
  // A grammar that admits no first token matches no text at all ($ref loops, an empty
  // character class, a rule defined only by itself): the client's error, found here, not
  // while generating.
  if (TokenConstraint(result).update() == 0) {
    throw InvalidGrammar("the schema or grammar matches no text at all (a $ref loop, an empty character class, "
                         "or a rule that only refers to itself?)");
  }
  return result;
}

std::string GrammarCompiler::ebnf(const GrammarSpec& spec) { return grammar_of(spec).ToString(); }

struct TokenConstraint::Impl {
  std::shared_ptr<const CompiledGrammar> grammar;
  xgrammar::GrammarMatcher matcher;
  std::vector<int32_t> mask;  // bit t of word t / 32: token t allowed
  int64_t shape[1];
  explicit Impl(std::shared_ptr<const CompiledGrammar> g)
      : grammar(std::move(g)), matcher(grammar->grammar), mask((grammar->n_vocab + 31) / 32, 0) {
    shape[0] = static_cast<int64_t>(mask.size());
  }
  bool bit(TokenId t) const {
    const auto u = static_cast<size_t>(t);
    return t >= 0 && u < grammar->n_vocab && ((static_cast<uint32_t>(mask[u / 32]) >> (u % 32)) & 1u) != 0;
  }
};

TokenConstraint::TokenConstraint(std::shared_ptr<const CompiledGrammar> grammar)
    : impl_(std::make_unique<Impl>(std::move(grammar))) {}
TokenConstraint::~TokenConstraint() = default;
TokenConstraint::TokenConstraint(TokenConstraint&&) noexcept = default;

size_t TokenConstraint::update() {
  auto& m = impl_->mask;
  if (impl_->matcher.IsTerminated()) {
    std::fill(m.begin(), m.end(), 0);
    return 0;
  }
  DLTensor t{};
  t.data = m.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLInt, 32, 1};
  t.shape = impl_->shape;
  impl_->matcher.FillNextTokenBitmask(&t);
  // Bits past the vocabulary (the last word's tail) are never tokens.
  const size_t n = impl_->grammar->n_vocab;
  if (n % 32 != 0) m.back() = static_cast<int32_t>(static_cast<uint32_t>(m.back()) & ((1u << (n % 32)) - 1u));
  size_t count = 0;
  for (int32_t w : m) count += static_cast<size_t>(std::popcount(static_cast<uint32_t>(w)));
  return count;
}

bool TokenConstraint::allowed(TokenId token) const { return impl_->bit(token); }

void TokenConstraint::allowed_tokens(std::vector<TokenId>& out) const {
  out.clear();
  const auto& m = impl_->mask;
  for (size_t w = 0; w < m.size(); ++w) {
    for (auto bits = static_cast<uint32_t>(m[w]); bits != 0; bits &= bits - 1) {
      out.push_back(static_cast<TokenId>(w * 32 + static_cast<size_t>(std::countr_zero(bits))));
    }
  }
}

size_t TokenConstraint::apply(TokenScores scores) const {
  size_t kept = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (impl_->bit(scores.id(i))) {
      ++kept;
    } else {
      scores.logits[i] = -INFINITY;
    }
  }
  return kept;
}

bool TokenConstraint::accept(TokenId token) { return impl_->matcher.AcceptToken(token); }

}  // namespace kestrel::runtime
