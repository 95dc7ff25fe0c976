// Tokenizer built from GGUF metadata.
//
// Supported: `tokenizer.ggml.model = "llama"` (SentencePiece-style BPE over scores, byte
// fallback), which Gemma 3 uses, and `"gemma4"` (BPE over merge ranks, text/bpe.h), which Gemma 4
// uses: spaces written as U+2581, raw text split into runs of newlines and of other characters,
// each run merged by rank, byte fallback. The choice follows the file's tokenizer metadata,
// never its architecture. The algorithm is llama.cpp's SPM tokenizer
// (src/llama-vocab.cpp, llm_tokenizer_spm): text split into UTF-8 characters, the adjacent pair
// whose merge is a vocabulary piece with the highest score merged first (leftmost on ties),
// pieces not in the vocabulary emitted as <0xXX> byte tokens. Spaces are written as U+2581.
// Control tokens are matched in text only when parse_special is set; user-defined tokens
// (e.g. Gemma's "\n\n") are always matched first, as llama.cpp does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/formats/gguf.h"
#include "kestrel/text/bpe.h"

namespace kestrel::text {

using TokenId = int32_t;

/// Token types as GGUF's tokenizer.ggml.token_type stores them (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
};

class Tokenizer {
 public:
  /// Reads tokenizer.ggml.* from the file. Throws kestrel::Error for an unsupported
  /// tokenizer.ggml.model or inconsistent arrays (tokens, scores and types of different lengths,
  /// special ids out of range, "gemma4" without tokenizer.ggml.merges).
  static Tokenizer from_gguf(const gguf::File& file);

  /// Encodes UTF-8 `text`. add_special: prepend BOS (and append EOS) as the metadata says.
  /// parse_special: match control tokens such as "<start_of_turn>" written in the text.
  /// Invalid UTF-8 is encoded byte by byte through byte tokens, never rejected.
  std::vector<TokenId> encode(std::string_view text, bool add_special, bool parse_special) const;

  /// Bytes of one token: spaces restored from U+2581, byte tokens as their byte, control tokens
  /// as "" unless render_special. Throws kestrel::Error for an id outside the vocabulary.
  std::string token_to_piece(TokenId id, bool render_special = false) const;
  /// Concatenated pieces (may end inside a UTF-8 character when cut from a stream).
  std::string decode(std::span<const TokenId> ids, bool render_special = false) const;

  size_t n_vocab() const { return pieces_.size(); }
  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  TokenType type(TokenId id) const;
  const std::string& piece(TokenId id) const;  // raw vocabulary string (with U+2581)
  /// Exact vocabulary lookup of a raw piece, e.g. "<end_of_turn>".
  std::optional<TokenId> find(std::string_view piece) const;
  /// Tokens that end a turn: EOS, Gemma 3's <end_of_turn>, Gemma 4's <turn|> and
  /// <|tool_response> (generation_config eos_token_id [1, 106, 50]), those the vocabulary has.
  std::vector<TokenId> stop_tokens() const;

 private:
  /// One node of the trie over the split tokens (first-child / next-sibling links).
  struct TrieNode {
    int32_t first_child = -1;
    int32_t next_sibling = -1;
    int32_t rank = -1;  // index into split_tokens_ of the token ending here, or -1
    uint8_t byte = 0;
  };
  /// A piece of the input: raw text [offset, offset + length) when token < 0, else one token.
  struct Fragment {
    size_t offset = 0;
    size_t length = 0;
    TokenId token = -1;
  };

  void build_split_index();
  std::vector<int32_t> present_split_ranks(std::string_view text, bool parse_special) const;
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;
  void tokenize_raw(std::string_view text, std::vector<TokenId>& out) const;  // SPM on one fragment
  void tokenize_bpe(std::string_view text, std::vector<TokenId>& out) const;  // gemma4 BPE
  TokenId byte_token(uint8_t byte) const;
  void check_id(TokenId id) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  std::vector<uint8_t> control_;  // 1: control, unknown, or an EOG text llama.cpp forces
  /// One slot of index_: a token id (-1: empty slot) and the high 32 bits of its piece_hash.
  struct IndexSlot {
    TokenId id = -1;
    uint32_t tag = 0;
  };
  /// Exact piece -> id lookup: open addressing over ids (linear probing, a power of two at least
  /// twice the vocabulary), keys compared against pieces_, so the 262,144 pieces of Gemma's
  /// vocabulary are not copied into a second container at load.
  std::vector<IndexSlot> index_;
  static uint64_t piece_hash(std::string_view piece) { return std::hash<std::string_view>{}(piece); }
  size_t probe(std::string_view piece, uint64_t hash) const;  // slot of `piece`, or where it goes
  TokenId lookup(std::string_view piece) const;  // -1 when no piece is `piece`
  void build_index();                            // index_ over all of pieces_
  std::vector<TokenId> split_tokens_;  // control, unknown and user-defined tokens, longest first
  std::vector<TrieNode> trie_;         // over split_tokens_; node 0 is the root
  TokenId byte_tokens_[256] = {};
  TokenId bos_ = -1, eos_ = -1, unk_ = -1;
  bool add_bos_ = true, add_eos_ = false, add_space_prefix_ = false;
  std::shared_ptr<const BpeMerges> bpe_;  // set for tokenizer.ggml.model "gemma4"
};

/// Turns a stream of tokens into text that never ends inside a UTF-8 character: bytes of an
/// incomplete character are held until the next token completes it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool render_special = false)
      : tokenizer_(&tokenizer), render_special_(render_special) {}
  /// Returns the complete UTF-8 text that `id` finishes (possibly empty).
  std::string push(TokenId id);
  /// Returns whatever is held back (an incomplete sequence at the end of generation).
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool render_special_;
  std::string pending_;
};

}  // namespace kestrel::text
