// Test tool: the token masks Kestrel's grammar layer computes along a token sequence, for
// tests/python/test_grammar.py to compare with xgrammar's Python package.
//   kestrel_grammar_masks MODEL KIND SPEC_FILE < token ids
// KIND: json_schema, json_object, regex, ebnf or lark. Prints one JSON object per line: the
// mask before each token and after the last one, {"step", "allowed", "mask"} with mask the
// bitmask as hex (32-bit words, bit t of word t/32 for token t, each word 8 hex digits, least
// significant first), then the token's acceptance: {"token", "accepted"}; stops at a refusal.
// The first line lists the tokens no grammar may emit (the detokenizer writes them as nothing):
// {"special": [ids]}; the second the grammar compiled, as EBNF: {"ebnf": text}.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/formats/gguf.h"
#include "kestrel/runtime/grammar.h"
#include "kestrel/text/tokenizer.h"

namespace {

using kestrel::runtime::GrammarSpec;

GrammarSpec::Kind parse_kind(const std::string& s) {
  if (s == "json_schema") return GrammarSpec::Kind::kJsonSchema;
  if (s == "json_object") return GrammarSpec::Kind::kJsonObject;
  if (s == "regex") return GrammarSpec::Kind::kRegex;
  if (s == "ebnf") return GrammarSpec::Kind::kEbnf;
  if (s == "lark") return GrammarSpec::Kind::kLark;
  throw kestrel::Error("unknown grammar kind " + s);
}

std::string hex_mask(const kestrel::runtime::TokenConstraint& c, size_t n_vocab) {
  std::string out;
  char buf[9];
  for (size_t w = 0; w < (n_vocab + 31) / 32; ++w) {
    uint32_t word = 0;
    for (size_t b = 0; b < 32 && w * 32 + b < n_vocab; ++b) {
      if (c.allowed(static_cast<kestrel::runtime::TokenId>(w * 32 + b))) word |= 1u << b;
    }
    std::snprintf(buf, sizeof buf, "%08x", word);
    out += buf;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL KIND SPEC_FILE < token ids\n", argv[0]);
    return 2;
  }
  try {
    const auto file = kestrel::gguf::File::open(argv[1]);
    const auto tokenizer = kestrel::text::Tokenizer::from_gguf(file);
    std::ifstream in(argv[3], std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    kestrel::runtime::GrammarCompiler compiler(tokenizer, tokenizer.stop_tokens(), 2);
    const GrammarSpec spec{parse_kind(argv[2]), text.str(), true};
    kestrel::runtime::TokenConstraint c(compiler.compile(spec));
    std::string special;
    for (size_t i = 0; i < tokenizer.n_vocab(); ++i) {
      if (tokenizer.token_to_piece(static_cast<kestrel::runtime::TokenId>(i)).empty()) {
        special += (special.empty() ? "" : ", ") + std::to_string(i);
      }
    }
    std::printf("{\"special\": [%s]}\n", special.c_str());
    std::printf("%s\n", nlohmann::json{{"ebnf", compiler.ebnf(spec)}}.dump().c_str());
    std::vector<kestrel::runtime::TokenId> tokens;
    for (long long t; std::cin >> t;) tokens.push_back(static_cast<kestrel::runtime::TokenId>(t));
    for (size_t i = 0; i <= tokens.size(); ++i) {
      const size_t allowed = c.update();
      std::printf("{\"step\": %zu, \"allowed\": %zu, \"mask\": \"%s\"}\n", i, allowed,
                  hex_mask(c, tokenizer.n_vocab()).c_str());
      if (i == tokens.size()) break;
      const bool ok = c.accept(tokens[i]);
      std::printf("{\"token\": %d, \"accepted\": %s}\n", tokens[i], ok ? "true" : "false");
      if (!ok) break;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
