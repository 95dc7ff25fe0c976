#include "kestrel/runtime/grammar.h"

#include <bit>
#include <cmath>
#include <exception>
#include <utility>

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
// special (never allowed by a grammar). Given to xgrammar as a RAW vocabulary: no decoding.
std::vector<std::string> token_bytes(const text::Tokenizer& tokenizer) {
  std::vector<std::string> vocab(tokenizer.n_vocab());
  for (size_t i = 0; i < vocab.size(); ++i) {
    const auto id = static_cast<TokenId>(i);
    const auto type = tokenizer.type(id);
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

}  // namespace

struct GrammarCompiler::Impl {
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;
  std::mutex mutex;  // xgrammar's compiler is thread-safe; compile() is serialized to bound memory and threads
  Impl(const text::Tokenizer& tokenizer, std::vector<TokenId> stop_tokens, int n_threads)
      : info(token_bytes(tokenizer), xgrammar::VocabType::RAW, std::nullopt, std::move(stop_tokens), false),
        compiler(info, std::max(1, n_threads)) {}
};

GrammarCompiler::GrammarCompiler(const text::Tokenizer& tokenizer, std::vector<TokenId> stop_tokens, int n_threads)
    : impl_(std::make_unique<Impl>(tokenizer, std::move(stop_tokens), n_threads)), n_vocab_(tokenizer.n_vocab()) {}

GrammarCompiler::~GrammarCompiler() = default;

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) {
  using Kind = GrammarSpec::Kind;
  std::lock_guard lock(impl_->mutex);
  auto& c = impl_->compiler;
  auto make = [&](xgrammar::CompiledGrammar g) { return std::make_shared<const CompiledGrammar>(std::move(g), n_vocab_); };
  switch (spec.kind) {
    case Kind::kJsonSchema:
      check_json_schema(spec.text);
      // Compact JSON (", " and ": " separators, no free whitespace): a small model given free
      // whitespace can emit newlines forever; the answer parses the same.
      return make(compiled("JSON schema", [&] {
        return c.CompileJSONSchema(spec.text, /*any_whitespace=*/false, std::nullopt, std::nullopt, spec.strict);
      }));
    case Kind::kJsonObject:
      return make(compiled("JSON schema", [&] {
        return c.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false, std::nullopt, std::nullopt,
                                   /*strict_mode=*/false);
      }));
    case Kind::kRegex:
      return make(compiled("regular expression", [&] { return c.CompileRegex(spec.text); }));
    case Kind::kEbnf:
      return make(compiled("grammar", [&] { return c.CompileGrammar(spec.text, "root"); }));
    case Kind::kLark:
      return make(compiled("Lark grammar", [&] { return c.CompileLark(spec.text); }));
  }
  throw InvalidGrammar("unknown grammar kind");
}

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
bool TokenConstraint::completed() const { return impl_->matcher.IsCompleted(); }
bool TokenConstraint::terminated() const { return impl_->matcher.IsTerminated(); }

}  // namespace kestrel::runtime
