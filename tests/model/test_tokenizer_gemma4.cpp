// The Gemma 4 BPE tokenizer (tokenizer.ggml.model "gemma4") against HF `tokenizers` on a
// Gemma-4-style tokenizer.json (tests/data/gemma4/e2b_tiny/hf/tokenizer.json: BPE with merges
// and byte fallback, spaces as U+2581, newline runs split off, Gemma 4's special tokens), whose
// vocabulary and merges the GGUF carries. Goldens: tests/goldens/gemma4_tokenizer.json, written
// by scripts/goldens/make_tiny_gemma4.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/text/tokenizer.h"
#include "source_dir.h"

namespace kestrel::text {
namespace {

namespace fs = std::filesystem;

class Gemma4Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    file_ = new gguf::File(gguf::File::open(::kestrel::testing::source_dir() / "tests/data/gemma4/e2b_tiny/model.gguf"));
    tok_ = new Tokenizer(Tokenizer::from_gguf(*file_));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete file_;
  }
  static gguf::File* file_;
  static Tokenizer* tok_;
};
gguf::File* Gemma4Tokenizer::file_ = nullptr;
Tokenizer* Gemma4Tokenizer::tok_ = nullptr;

TEST_F(Gemma4Tokenizer, MatchesHfTokenizersOnEveryGoldenString) {
  std::ifstream in(::kestrel::testing::source_dir() / "tests/goldens/gemma4_tokenizer.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  size_t n = 0, roundtrips = 0;
  for (const auto& c : j.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    const auto ids = c.at("ids").get<std::vector<TokenId>>();
    EXPECT_EQ(tok_->encode(text, /*add_special=*/true, /*parse_special=*/true), ids) << "text: " << text;
    ++n;
    if (text.find('<') == std::string::npos) {  // no special tokens: decoding gives the text back
      EXPECT_EQ(tok_->decode(ids), text);
      ++roundtrips;
    }
  }
  EXPECT_GE(n, 300u);
  EXPECT_GE(roundtrips, 100u);
}

TEST_F(Gemma4Tokenizer, SpecialTokensAndBos) {
  EXPECT_EQ(tok_->bos(), 2);
  EXPECT_EQ(tok_->encode("", true, false), std::vector<TokenId>{2});
  const auto turn = tok_->find("<|turn>");
  ASSERT_TRUE(turn.has_value());
  EXPECT_EQ(tok_->encode("<|turn>", false, true), std::vector<TokenId>{*turn});
  // A control token is plain text without parse_special; a user-defined one (<|channel>, kept
  // visible by llama.cpp's converter) is always matched and always rendered.
  EXPECT_NE(tok_->encode("<|turn>", false, false), std::vector<TokenId>{*turn});
  const auto channel = tok_->find("<|channel>");
  ASSERT_TRUE(channel.has_value());
  EXPECT_EQ(tok_->encode("<|channel>", false, false), std::vector<TokenId>{*channel});
  EXPECT_EQ(tok_->decode(std::vector<TokenId>{*channel}), "<|channel>");
  EXPECT_EQ(tok_->decode(std::vector<TokenId>{*turn}), "");
}

}  // namespace
}  // namespace kestrel::text
