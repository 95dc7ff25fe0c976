// Merge-rank BPE over UTF-8 characters, the model of Gemma 4's tokenizer (GGUF
// tokenizer.ggml.model = "gemma4": tokens plus tokenizer.ggml.merges; HF tokenizer.json
// "model": {"type": "BPE", "byte_fallback": true}).
//
// Algorithm (HF tokenizers' BPE::merge_word; llama.cpp's llm_tokenizer_bpe_session): a word
// starts as its UTF-8 characters; the adjacent pair with the lowest merge rank is merged,
// leftmost first among equal ranks, until no adjacent pair is a merge. Each final symbol that is
// a vocabulary piece is emitted as that token, any other as one <0xXX> byte token per byte.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kestrel::text {

class BpeMerges {
 public:
  /// `merges[r]` = "left right" (one space between the two pieces) has rank r. Throws
  /// kestrel::Error for an entry without a separating space.
  explicit BpeMerges(const std::vector<std::string>& merges);

  /// Appends the tokens of `word` to `out`. `find` maps a piece to its id (nullopt when not in
  /// the vocabulary); `byte_token` gives the id of a byte's fallback token (it may throw).
  void encode(std::string_view word,
              const std::function<std::optional<int32_t>(std::string_view)>& find,
              const std::function<int32_t(uint8_t)>& byte_token, std::vector<int32_t>& out) const;

  size_t size() const { return ranks_.size(); }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  /// Rank of merging pieces a and b, or -1.
  int32_t rank(std::string_view a, std::string_view b) const;

  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> ranks_;  // key "a b"
};

/// Gemma 4's pre-tokenization of one raw fragment (spaces already written as U+2581): runs of
/// newlines and runs of anything else, in order (llama.cpp's gemma4 pre-tokenizer regex
/// `[^\n]+|[\n]+`; in a tokenizer.json a Split on `\n+` with behaviour "isolated").
std::vector<std::string_view> split_newline_runs(std::string_view text);

}  // namespace kestrel::text
