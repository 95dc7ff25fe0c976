// Tokenizer against llama.cpp goldens (tests/goldens/tokenizer.json, made by
// scripts/goldens/make_tokenizer_goldens.py with llama-cpp-python) on the default model.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/runtime/model_path.h"
#include "kestrel/text/tokenizer.h"
#include "source_dir.h"

namespace kestrel::text {
namespace {

struct Golden {
  std::string name;
  std::string text;
  bool special = false;
  bool roundtrip = false;  // llama.cpp's detokenize gave the text back
  bool message = false;    // from the OpenAssistant data (as opposed to a hand-written case)
  std::vector<TokenId> ids;
};

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

const std::vector<Golden>& goldens() {
  static const std::vector<Golden> cases = [] {
    std::ifstream in(::kestrel::testing::source_dir() / "tests/goldens/tokenizer.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    std::vector<Golden> out;
    for (const auto& c : j.at("cases")) {
      Golden g;
      g.name = c.at("name").get<std::string>();
      g.text = c.contains("text") ? c.at("text").get<std::string>()
                                  : from_hex(c.at("bytes_hex").get<std::string>());
      g.special = c.at("special").get<bool>();
      g.roundtrip = c.contains("roundtrip") && c.at("roundtrip").is_boolean() &&
                    c.at("roundtrip").get<bool>();
      g.message = c.at("source").get<std::string>() == "oasst";
      g.ids = c.at("ids").get<std::vector<TokenId>>();
      out.push_back(std::move(g));
    }
    return out;
  }();
  return cases;
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    try {
      const std::filesystem::path path = runtime::default_model_path();
      file_ = std::make_unique<gguf::File>(gguf::File::open(path));
      tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file_));
    } catch (const Error& e) {
      skip_reason_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    tokenizer_.reset();
    file_.reset();
  }
  void SetUp() override {
    if (!tokenizer_) GTEST_SKIP() << "no model: " << skip_reason_;
  }
  const Tokenizer& tok() const { return *tokenizer_; }

  static std::unique_ptr<gguf::File> file_;
  static std::unique_ptr<Tokenizer> tokenizer_;
  static std::string skip_reason_;
};

std::unique_ptr<gguf::File> TokenizerTest::file_;
std::unique_ptr<Tokenizer> TokenizerTest::tokenizer_;
std::string TokenizerTest::skip_reason_;

/// True if `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      n = 1, cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      n = 2, cp = c & 0x1Fu;
    } else if ((c & 0xF0) == 0xE0) {
      n = 3, cp = c & 0x0Fu;
    } else if ((c & 0xF8) == 0xF0) {
      n = 4, cp = c & 0x07u;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

TEST_F(TokenizerTest, Metadata) {
  EXPECT_EQ(tok().n_vocab(), 262144u);
  EXPECT_EQ(tok().bos(), 2);
  EXPECT_EQ(tok().eos(), 1);
  EXPECT_TRUE(tok().add_bos());
  EXPECT_EQ(tok().type(105), TokenType::kControl);
  EXPECT_EQ(tok().type(107), TokenType::kUserDefined);
  EXPECT_EQ(tok().type(238), TokenType::kByte);
  EXPECT_EQ(tok().find("<end_of_turn>"), std::optional<TokenId>(106));
  EXPECT_EQ(tok().find("\n\n"), std::optional<TokenId>(108));
  EXPECT_EQ(tok().find("no such piece at all"), std::nullopt);
  EXPECT_EQ(tok().piece(2), "<bos>");
}

TEST_F(TokenizerTest, GoldensFileIsLargeEnough) {
  size_t messages = 0;
  for (const Golden& g : goldens()) messages += g.message ? 1 : 0;
  EXPECT_GE(messages, 250u);
  EXPECT_GE(goldens().size() - messages, 25u);
}

TEST_F(TokenizerTest, EncodeMatchesLlamaCpp) {
  size_t failures = 0;
  for (const Golden& g : goldens()) {
    const std::vector<TokenId> ids = tok().encode(g.text, /*add_special=*/true, g.special);
    EXPECT_EQ(ids, g.ids) << "case " << g.name << " (special=" << g.special << ")";
    if (ids != g.ids && ++failures >= 5) break;
  }
}

TEST_F(TokenizerTest, DecodeRoundTrips) {
  for (const Golden& g : goldens()) {
    if (g.special) continue;
    const std::vector<TokenId> ids = tok().encode(g.text, /*add_special=*/false, false);
    if (g.message || g.roundtrip) {
      EXPECT_EQ(tok().decode(ids), g.text) << "case " << g.name;
    }
    ASSERT_GE(g.ids.size(), 1u);
    const std::vector<TokenId> golden_tail(g.ids.begin() + 1, g.ids.end());
    EXPECT_EQ(ids, golden_tail) << "without BOS, case " << g.name;
  }
}

TEST_F(TokenizerTest, EncodeFlags) {
  EXPECT_EQ(tok().encode("", true, false), std::vector<TokenId>{2});
  EXPECT_TRUE(tok().encode("", false, false).empty());
  EXPECT_EQ(tok().encode("<end_of_turn>", false, true), std::vector<TokenId>{106});
  EXPECT_GT(tok().encode("<end_of_turn>", false, false).size(), 1u);
  // User-defined tokens split out even without parse_special.
  EXPECT_EQ(tok().encode("\n\n", false, false), std::vector<TokenId>{108});
}

TEST_F(TokenizerTest, TokenToPiece) {
  EXPECT_EQ(tok().token_to_piece(2), "");
  EXPECT_EQ(tok().token_to_piece(2, /*render_special=*/true), "<bos>");
  EXPECT_EQ(tok().token_to_piece(106), "");
  EXPECT_EQ(tok().token_to_piece(106, true), "<end_of_turn>");
  EXPECT_EQ(tok().token_to_piece(107), "\n");
  EXPECT_EQ(tok().token_to_piece(108), "\n\n");
  EXPECT_EQ(tok().token_to_piece(138), "  ");
  EXPECT_EQ(tok().token_to_piece(168), "<table>");
  EXPECT_EQ(tok().token_to_piece(238), std::string(1, '\0'));
  EXPECT_EQ(tok().token_to_piece(238 + 0x41), "A");
  EXPECT_EQ(tok().token_to_piece(238 + 0xFF), "\xff");
  EXPECT_EQ(tok().token_to_piece(236743), " ");  // "▁"
  const std::vector<TokenId> hello = tok().encode("Hello world", false, false);
  EXPECT_EQ(tok().decode(hello), "Hello world");
}

TEST_F(TokenizerTest, OutOfRangeIdsThrow) {
  const auto n = static_cast<TokenId>(tok().n_vocab());
  EXPECT_THROW(tok().token_to_piece(n), Error);
  EXPECT_THROW(tok().token_to_piece(-1), Error);
  EXPECT_THROW(tok().type(n), Error);
  EXPECT_THROW(tok().piece(-5), Error);
  const std::vector<TokenId> ids = {2, n + 10};
  EXPECT_THROW(tok().decode(ids), Error);
  StreamDecoder stream(tok());
  EXPECT_THROW(stream.push(n), Error);
}

/// Feeds `ids` one at a time; checks every chunk is valid UTF-8 and the total equals decode().
void expect_stream_ok(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  StreamDecoder stream(tok);
  std::string total;
  for (const TokenId id : ids) {
    const std::string chunk = stream.push(id);
    EXPECT_TRUE(valid_utf8(chunk)) << "chunk after token " << id;
    total += chunk;
  }
  const std::string rest = stream.flush();
  total += rest;
  EXPECT_EQ(total, tok.decode(ids));
}

TEST_F(TokenizerTest, StreamDecoderHoldsBackPartialCharacters) {
  // Emoji and rare characters that the vocabulary spells with byte tokens.
  const std::string text = "a 😀 b 𠜎𠜱 c 🇫🇷 é 日本 ✓";
  const std::vector<TokenId> ids = tok().encode(text, false, false);
  size_t bytes = 0;
  for (const TokenId id : ids) bytes += tok().type(id) == TokenType::kByte ? 1 : 0;
  EXPECT_GT(bytes, 0u) << "the text should need byte tokens";
  expect_stream_ok(tok(), ids);

  // An emoji spelled byte by byte: nothing until the last byte, then the whole character.
  const std::string grin = "😀";
  StreamDecoder stream(tok());
  for (size_t i = 0; i < grin.size(); ++i) {
    const std::string out = stream.push(238 + static_cast<unsigned char>(grin[i]));
    EXPECT_EQ(out, i + 1 < grin.size() ? "" : grin);
  }
  EXPECT_EQ(stream.flush(), "");

  // An incomplete sequence at the end comes out of flush().
  StreamDecoder cut(tok());
  EXPECT_EQ(cut.push(238 + 0xF0), "");
  EXPECT_EQ(cut.push(238 + 0x9F), "");
  EXPECT_EQ(cut.flush(), "\xF0\x9F");
}

TEST_F(TokenizerTest, StreamDecoderOnMessages) {
  for (const Golden& g : goldens()) {
    if (!g.message) continue;
    expect_stream_ok(tok(), std::vector<TokenId>(g.ids.begin() + 1, g.ids.end()));
  }
}

TEST_F(TokenizerTest, EncodeSpeed) {
  const auto start = std::chrono::steady_clock::now();
  size_t n = 0, total = 0;
  for (const Golden& g : goldens()) {
    if (!g.message) continue;
    total += tok().encode(g.text, true, false).size();
    ++n;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[ timing   ] " << n << " messages, " << total << " tokens in " << seconds * 1e3
            << " ms\n";
#ifdef NDEBUG
  EXPECT_LT(seconds, 1.0);
#endif
}

}  // namespace
}  // namespace kestrel::text
