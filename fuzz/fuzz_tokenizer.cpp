// libFuzzer target: the tokenizer on arbitrary text.
//
// Two tokenizers are built once from a small fixed vocabulary (written as a GGUF image in
// memory with tests/unit/gguf_writer.h): one Gemma-like (add_space_prefix = false), one with
// SentencePiece's default space prefix and BOS+EOS. Each input is encoded with every
// combination of add_special/parse_special, decoded, and streamed through StreamDecoder; the
// input bytes are also decoded as raw token ids.
//
// Checked invariants (a violation aborts, which libFuzzer reports as a crash):
//  * no exception other than kestrel::Error, no sanitizer report;
//  * StreamDecoder's pushes plus flush() concatenate to decode() of the same ids;
//  * decode(encode(x)) == x for the Gemma-like vocabulary (" " + x with the space prefix) when
//    x is valid UTF-8 and contains no text of a token that does not decode to itself (control,
//    unknown, unused and byte tokens such as "<eos>" or "<0x41>") and no U+2581 (the
//    SentencePiece space mark, which decodes to " "). For the space-prefix vocabulary x must
//    also contain no user-defined token, after which llama.cpp adds a space prefix again.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "gguf_writer.h"
#include "kestrel/base/error.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/text/tokenizer.h"

namespace {

namespace gg = kestrel::gguf;
using gg::testing::Bytes;
using gg::testing::GgufWriter;
using kestrel::text::TokenId;
using kestrel::text::Tokenizer;
using kestrel::text::TokenType;

struct Entry {
  std::string piece;
  TokenType type;
};

std::vector<Entry> vocabulary() {
  std::vector<Entry> v = {
      {"<pad>", TokenType::kControl},         {"<eos>", TokenType::kControl},
      {"<bos>", TokenType::kControl},         {"<unk>", TokenType::kUnknown},
      {"<start_of_turn>", TokenType::kControl}, {"<end_of_turn>", TokenType::kControl},
      {"\n\n", TokenType::kUserDefined},      {"</s>", TokenType::kUserDefined},  // forced control
      {"<tab>", TokenType::kUserDefined},     {"<unused0>", TokenType::kUnused},
      {"<mask>", TokenType::kUndefined},
  };
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    v.push_back({std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'}, TokenType::kByte});
  }
  v.push_back({"\xe2\x96\x81", TokenType::kNormal});  // the space mark alone
  for (char c = 33; c < 127; ++c) v.push_back({std::string(1, c), TokenType::kNormal});
  static constexpr const char* kMerges[] = {
      "\xe2\x96\x81t", "th", "he", "\xe2\x96\x81the", "in", "er", "an", "\xe2\x96\x81" "a", "on",
      "re", "ing", "\xe2\x96\x81of", "\xe2\x96\x81" "and", "\xe2\x96\x81to", "ed",
      "\xe2\x96\x81in", "is", "\xe2\x96\x81is", "it", "at", "or", "en", "es", "ll", "llo",
      "He", "Hello", "\xe2\x96\x81Hello", "\xe2\x96\x81w", "wor", "ld", "\xe2\x96\x81world",
      "\xe2\x96\x81\xe2\x96\x81", "\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81", "\n", "\t",
      "\xc3\xa9", "\xc3\xbc", "\xe6\x97\xa5", "\xe6\x9c\xac", "\xe6\x97\xa5\xe6\x9c\xac",
      "\xe8\xaa\x9e", "\xf0\x9f\x98\x80", "<", ">", "<s", "/s",  // parts of special texts
      "\xe2\x96\x81<", "user", "model", "\xe2\x96\x81user",
  };
  for (const char* m : kMerges) v.push_back({m, TokenType::kNormal});
  v.push_back({"he", TokenType::kNormal});  // a duplicate piece: the later id wins
  v.push_back({"", TokenType::kNormal});    // an empty piece, renamed [EMPTY_n]
  return v;
}

std::vector<std::byte> vocabulary_gguf(bool space_prefix) {
  const std::vector<Entry> v = vocabulary();
  Bytes tokens, scores, types;
  tokens.type(gg::ValueType::kString).u64(v.size());
  scores.type(gg::ValueType::kFloat32).u64(v.size());
  types.type(gg::ValueType::kInt32).u64(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    tokens.str(v[i].piece);
    scores.f32(v[i].type == TokenType::kNormal ? -static_cast<float>(i % 37) : 0.0f);
    types.i32(static_cast<int32_t>(v[i].type));
  }
  GgufWriter w;
  w.kv("general.architecture", gg::ValueType::kString, Bytes().str("gemma3"));
  w.kv("tokenizer.ggml.model", gg::ValueType::kString, Bytes().str("llama"));
  w.kv("tokenizer.ggml.tokens", gg::ValueType::kArray, tokens);
  w.kv("tokenizer.ggml.scores", gg::ValueType::kArray, scores);
  w.kv("tokenizer.ggml.token_type", gg::ValueType::kArray, types);
  w.kv("tokenizer.ggml.bos_token_id", gg::ValueType::kUint32, Bytes().u32(2));
  w.kv("tokenizer.ggml.eos_token_id", gg::ValueType::kUint32, Bytes().u32(1));
  w.kv("tokenizer.ggml.unknown_token_id", gg::ValueType::kUint32, Bytes().u32(3));
  w.kv("tokenizer.ggml.add_bos_token", gg::ValueType::kBool, Bytes().u8(1));
  w.kv("tokenizer.ggml.add_eos_token", gg::ValueType::kBool, Bytes().u8(space_prefix ? 1 : 0));
  w.kv("tokenizer.ggml.add_space_prefix", gg::ValueType::kBool, Bytes().u8(space_prefix ? 1 : 0));
  return w.build();
}

struct Fixture {
  Tokenizer tok;
  bool space_prefix;
  std::vector<std::string> forbidden;  // texts whose presence voids the round-trip invariant
};

Fixture make_fixture(bool space_prefix) {
  const std::vector<std::byte> image = vocabulary_gguf(space_prefix);
  const gg::File file = gg::File::parse(image);  // the Tokenizer copies what it needs
  Fixture f{Tokenizer::from_gguf(file), space_prefix, {"\xe2\x96\x81"}};
  for (size_t id = 0; id < f.tok.n_vocab(); ++id) {
    const auto t = static_cast<TokenId>(id);
    std::string surface;
    const std::string& raw = f.tok.piece(t);
    for (size_t i = 0; i < raw.size();) {
      if (raw.compare(i, 3, "\xe2\x96\x81") == 0) {
        surface += ' ';
        i += 3;
      } else {
        surface += raw[i++];
      }
    }
    const bool self = f.tok.token_to_piece(t) == surface;
    const bool user = f.tok.type(t) == TokenType::kUserDefined;
    if (!self || (space_prefix && user)) f.forbidden.push_back(raw);
  }
  return f;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) { n = 1; cp = c; }
    else if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; }
    else return false;
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

[[noreturn]] void finding(const char* what, std::string_view input, const std::string& got,
                          const std::string& want) {
  std::fprintf(stderr, "fuzz_tokenizer: %s\n  input (%zu bytes), got %zu bytes, want %zu bytes\n",
               what, input.size(), got.size(), want.size());
  std::fprintf(stderr, "  got:  '%s'\n  want: '%s'\n", got.c_str(), want.c_str());
  std::abort();
}

void check(const Fixture& f, std::string_view text) {
  const bool round_trip =
      valid_utf8(text) && [&] {
        for (const std::string& s : f.forbidden) {
          if (text.find(s) != std::string_view::npos) return false;
        }
        return true;
      }();
  for (int flags = 0; flags < 4; ++flags) {
    const bool add_special = flags & 1;
    const bool parse_special = flags & 2;
    std::vector<TokenId> ids;
    try {
      ids = f.tok.encode(text, add_special, parse_special);
    } catch (const kestrel::Error&) {
      continue;  // e.g. a byte without a byte token; this vocabulary has all 256
    }
    {
      const bool render = add_special;  // both renderings are covered, at half the cost
      const std::string decoded = f.tok.decode(ids, render);
      kestrel::text::StreamDecoder stream(f.tok, render);
      std::string streamed;
      for (const TokenId id : ids) streamed += stream.push(id);
      streamed += stream.flush();
      if (streamed != decoded) finding("StreamDecoder output differs from decode", text, streamed, decoded);
      if (round_trip && !render) {
        const std::string want = (f.space_prefix && !text.empty() ? " " : "") + std::string(text);
        if (decoded != want) finding("decode(encode(x)) != x", text, decoded, want);
      }
    }
  }
}

void decode_raw_ids(const Fixture& f, const uint8_t* data, size_t size) {
  std::vector<TokenId> ids(size / sizeof(TokenId));
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * sizeof(TokenId));
  for (TokenId& id : ids) id %= static_cast<TokenId>(f.tok.n_vocab() + 8);  // mostly in range
  for (const bool render : {false, true}) {
    try {
      (void)f.tok.decode(ids, render);
    } catch (const kestrel::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Fixture gemma_like = make_fixture(false);
  static const Fixture spm_default = make_fixture(true);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check(gemma_like, text);
  check(spm_default, text);
  decode_raw_ids(gemma_like, data, size);
  return 0;
}
