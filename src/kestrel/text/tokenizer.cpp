// SentencePiece-style tokenizer, token-for-token compatible with llama.cpp.
//
// Source of the algorithms: llama.cpp src/llama-vocab.cpp —
//   * llama_vocab::impl::load: token attributes from tokenizer.ggml.token_type, SPM defaults
//     (BOS 1, EOS 2, UNK 0, add_bos, add_space_prefix), and the end-of-generation texts whose
//     type is forced to control;
//   * tokenizer_st_partition: control/user-defined tokens cut out of the text, longest first;
//   * llm_tokenizer_spm_session: the bigram merge over UTF-8 characters with byte fallback;
//   * token_to_piece (SPM branch) for decoding.
#include "kestrel/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <queue>
#include <string>
#include <utility>

#include "kestrel/base/error.h"

namespace kestrel::text {
namespace {

constexpr std::string_view kSpaceMark = "\xe2\x96\x81";  // U+2581, SentencePiece's space

/// Length of the UTF-8 sequence that `lead` starts, as llama.cpp's unicode_len_utf8 computes it:
/// from the top four bits only, so stray continuation bytes count as one-byte characters.
size_t utf8_len(char lead) {
  static constexpr std::array<uint8_t, 16> kLen = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[static_cast<uint8_t>(lead) >> 4];
}

/// Replaces every occurrence of `from` in `text` with `to`.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size() + text.size() / 2);
  size_t pos = 0;
  for (size_t hit = text.find(from); hit != std::string_view::npos; hit = text.find(from, pos)) {
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

/// Texts llama.cpp marks as control even when the GGUF says otherwise (EOT/EOM/EOG/FIM
/// detection in llama_vocab::impl::load). For Gemma 3 this concerns "</s>" (user-defined in the
/// file): it is then split out only with parse_special and decodes to "" without render_special.
/// In byte order, for the binary search in forced_control.
constexpr std::string_view kForcedControlTexts[] = {
    "</s>", "<EOT>", "<MID>", "<PAD>", "<PRE>", "<REPO>", "<SUF>", "<end_of_turn>",
    "<end_of_utterance>", "<eos>", "<fim-middle>", "<fim-pad>", "<fim-prefix>", "<fim-repo>",
    "<fim-suffix>", "<fim_middle>", "<fim_pad>", "<fim_prefix>", "<fim_suffix>", "<reponame>",
    "<turn|>", "<|calls|>", "<|call|>", "<|code_middle|>", "<|code_prefix|>", "<|code_suffix|>",
    "<|end_of_text|>", "<|endoftext|>", "<|end|>", "<|eom_id|>", "<|eot_id|>", "<|file_sep|>",
    "<|fim_middle|>", "<|fim_pad|>", "<|fim_prefix|>", "<|fim_repo|>", "<|fim_suffix|>",
    "<|flush|>", "<|im_end|>", "<|middle|>", "<|prefix|>", "<|repo_name|>", "<|return|>",
    "<|suffix|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
    "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
    "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>",
    "[EOS]", "[EOT]", "[PAD]", "[e~[", "_<EOT>",
    "\xe2\x96\x81<MID>", "\xe2\x96\x81<PRE>", "\xe2\x96\x81<SUF>",
};
static_assert(std::ranges::is_sorted(kForcedControlTexts), "keep kForcedControlTexts in byte order");

/// Whether `text` is one of kForcedControlTexts. Called for every vocabulary piece at load
/// (262,144 for Gemma), so the last byte (one of '>', ']', '[') rejects almost all of them before
/// any string comparison.
bool forced_control(std::string_view text) {
  static constexpr std::array<bool, 256> kLastBytes = [] {
    std::array<bool, 256> last{};
    for (const std::string_view t : kForcedControlTexts) last[static_cast<uint8_t>(t.back())] = true;
    return last;
  }();
  if (text.empty() || !kLastBytes[static_cast<uint8_t>(text.back())]) return false;
  return std::binary_search(std::begin(kForcedControlTexts), std::end(kForcedControlTexts), text);
}

TokenType to_token_type(int64_t raw) {
  return raw >= 0 && raw <= 6 ? static_cast<TokenType>(raw) : TokenType::kUndefined;
}

/// A special-token id from the metadata, or `fallback` when absent; throws when out of range.
TokenId special_id(const gguf::File& file, std::string_view key, TokenId fallback, size_t n) {
  const std::optional<uint64_t> id = file.find_uint(key);
  if (!id) return fallback;
  if (*id >= n) {
    throw Error("tokenizer: " + std::string(key) + " = " + std::to_string(*id) +
                " is outside the vocabulary of " + std::to_string(n) + " tokens");
  }
  return static_cast<TokenId>(*id);
}

// --- SPM session (llm_tokenizer_spm_session) ------------------------------------------------

struct Symbol {
  int prev;
  int next;
  size_t offset;
  size_t n;  // 0 once merged into its left neighbour
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;
};

/// Orders the queue as llama.cpp's llm_bigram_spm::comparator: highest score first, then the
/// leftmost pair.
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

// --- Loading --------------------------------------------------------------------------------

Tokenizer Tokenizer::from_gguf(const gguf::File& file) {
  const std::string& model = file.get_string("tokenizer.ggml.model");
  if (model != "llama" && model != "gemma4") {
    throw Error("tokenizer: unsupported tokenizer.ggml.model '" + model + "' (supported: llama, gemma4)");
  }
  Tokenizer tok;
  if (model == "gemma4") {
    if (!file.has("tokenizer.ggml.merges")) throw Error("tokenizer: a gemma4 tokenizer needs tokenizer.ggml.merges");
    tok.bpe_ = std::make_shared<const BpeMerges>(file.get_string_array("tokenizer.ggml.merges"));
  }
  tok.pieces_ = file.get_string_array("tokenizer.ggml.tokens");
  const size_t n = tok.pieces_.size();
  if (n == 0 || n > static_cast<size_t>(INT32_MAX)) {
    throw Error("tokenizer: bad vocabulary size " + std::to_string(n));
  }
  tok.scores_ = file.has("tokenizer.ggml.scores") ? file.get_float_array("tokenizer.ggml.scores")
                                                  : std::vector<float>(n, 0.0f);
  if (tok.scores_.size() != n) {
    throw Error("tokenizer: " + std::to_string(tok.scores_.size()) + " scores for " +
                std::to_string(n) + " tokens");
  }
  tok.types_.assign(n, TokenType::kNormal);
  if (file.has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t> raw = file.get_int_array("tokenizer.ggml.token_type");
    if (raw.size() != n) {
      throw Error("tokenizer: " + std::to_string(raw.size()) + " token types for " +
                  std::to_string(n) + " tokens");
    }
    std::transform(raw.begin(), raw.end(), tok.types_.begin(), to_token_type);
  }

  tok.control_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    std::string& piece = tok.pieces_[i];
    if (piece.empty()) piece = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
    const TokenType t = tok.types_[i];
    tok.control_[i] = t == TokenType::kControl || t == TokenType::kUnknown || forced_control(piece);
  }
  tok.build_index();

  // SPM defaults from llama_vocab::impl::load, then the metadata.
  tok.bos_ = special_id(file, "tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1, n);
  tok.eos_ = special_id(file, "tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1, n);
  tok.unk_ = special_id(file, "tokenizer.ggml.unknown_token_id", 0, n);
  tok.add_bos_ = file.find_bool("tokenizer.ggml.add_bos_token").value_or(true);
  tok.add_eos_ = file.find_bool("tokenizer.ggml.add_eos_token").value_or(false);
  tok.add_space_prefix_ = file.find_bool("tokenizer.ggml.add_space_prefix").value_or(!tok.bpe_);

  // Byte fallback: "<0xXX>", else the byte itself as a piece (llama_vocab::byte_to_token).
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    TokenId id = tok.lookup(name);
    if (id < 0) id = tok.lookup(std::string(1, static_cast<char>(b)));
    tok.byte_tokens_[b] = id;
  }
  tok.build_split_index();
  return tok;
}

/// Collects the tokens tokenizer_st_partition cuts out of the text (control, unknown and
/// user-defined), ordered longest first, and builds a trie over them so that one pass over the
/// text finds which of them occur at all.
void Tokenizer::build_split_index() {
  split_tokens_.clear();
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const TokenType t = types_[i];
    if (control_[i] || t == TokenType::kUserDefined) {
      split_tokens_.push_back(static_cast<TokenId>(i));
    }
  }
  // llama.cpp uses an unstable std::sort by length; ties only matter for two different
  // equal-length tokens overlapping in the text, which Gemma's vocabulary cannot produce.
  std::stable_sort(split_tokens_.begin(), split_tokens_.end(), [&](TokenId a, TokenId b) {
    return pieces_[a].size() > pieces_[b].size();
  });
  trie_.assign(1, TrieNode{});
  for (size_t rank = 0; rank < split_tokens_.size(); ++rank) {
    int32_t node = 0;
    for (const char c : pieces_[split_tokens_[rank]]) {
      const auto byte = static_cast<uint8_t>(c);
      int32_t child = trie_[node].first_child;
      while (child >= 0 && trie_[child].byte != byte) child = trie_[child].next_sibling;
      if (child < 0) {
        child = static_cast<int32_t>(trie_.size());
        TrieNode fresh;
        fresh.byte = byte;
        fresh.next_sibling = trie_[node].first_child;
        trie_.push_back(fresh);
        trie_[node].first_child = child;
      }
      node = child;
    }
    trie_[node].rank = static_cast<int32_t>(rank);
  }
}

// --- Encoding -------------------------------------------------------------------------------

/// Ranks (positions in split_tokens_) of the split tokens that occur anywhere in `text`, in
/// ascending order. Only these can match in tokenizer_st_partition, so it runs over them alone.
std::vector<int32_t> Tokenizer::present_split_ranks(std::string_view text,
                                                    bool parse_special) const {
  std::vector<int32_t> ranks;
  for (size_t start = 0; start < text.size(); ++start) {
    int32_t node = 0;
    for (size_t i = start; i < text.size(); ++i) {
      const auto byte = static_cast<uint8_t>(text[i]);
      int32_t child = trie_[node].first_child;
      while (child >= 0 && trie_[child].byte != byte) child = trie_[child].next_sibling;
      if (child < 0) break;
      node = child;
      const int32_t rank = trie_[node].rank;
      if (rank >= 0 && (parse_special || !control_[split_tokens_[rank]])) ranks.push_back(rank);
    }
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

/// tokenizer_st_partition: for each split token, longest first, every raw fragment is cut at
/// the token's non-overlapping occurrences, left to right. Control and unknown tokens take part
/// only with parse_special; user-defined tokens always do. (The LSTRIP/RSTRIP attributes that
/// llama.cpp sets for a few named models are not modelled.)
std::vector<Tokenizer::Fragment> Tokenizer::partition(std::string_view text,
                                                      bool parse_special) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({0, text.size(), -1});
  for (const int32_t rank : present_split_ranks(text, parse_special)) {
    const TokenId id = split_tokens_[rank];
    const std::string& piece = pieces_[id];
    std::vector<Fragment> next;
    next.reserve(fragments.size() + 2);
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const size_t end = f.offset + f.length;
      const std::string_view window = text.substr(0, end);
      size_t pos = f.offset;
      for (size_t hit = window.find(piece, pos); hit != std::string_view::npos;
           hit = window.find(piece, pos)) {
        if (hit > pos) next.push_back({pos, hit - pos, -1});
        next.push_back({hit, piece.size(), id});
        pos = hit + piece.size();
      }
      if (pos < end) next.push_back({pos, end - pos, -1});
    }
    fragments = std::move(next);
  }
  return fragments;
}

TokenId Tokenizer::byte_token(uint8_t byte) const {
  const TokenId id = byte_tokens_[byte];
  if (id < 0) {
    throw Error("tokenizer: the vocabulary has no token for byte " + std::to_string(byte));
  }
  return id;
}

/// llm_tokenizer_spm_session::tokenize on one raw fragment (spaces already escaped to U+2581).
/// Symbols start as UTF-8 characters; the adjacent pair whose concatenation is a vocabulary
/// piece with the highest score (leftmost on ties) is merged until none is left; a queue entry
/// whose symbols changed since it was pushed is skipped. Every merged symbol is a vocabulary
/// piece, so llama.cpp's resegment step reduces to: emit the piece's id, or, for a single
/// character that is not in the vocabulary, one byte token per byte (its rev_merge lookup can
/// only hit vocabulary pieces, which are emitted before it is consulted).
void Tokenizer::tokenize_raw(std::string_view text, std::vector<TokenId>& out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offset = 0; offset < text.size();) {
    const size_t n = std::min(utf8_len(text[offset]), text.size() - offset);
    const int index = static_cast<int>(symbols.size());
    offset += n;
    symbols.push_back({index - 1, offset == text.size() ? -1 : index + 1, offset - n, n});
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t size = symbols[left].n + symbols[right].n;
    const TokenId id = lookup(text.substr(symbols[left].offset, size));
    if (id < 0) return;
    queue.push({left, right, scores_[id], size});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    if (left.n == 0 || right.n == 0 || left.n + right.n != top.size) continue;  // stale
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    try_add(left.prev, top.left);
    try_add(top.left, left.next);
  }

  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].offset, symbols[i].n);
    if (const TokenId id = lookup(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    for (const char c : piece) out.push_back(byte_token(static_cast<uint8_t>(c)));
  }
}

/// Gemma 4: each run of newlines or of other characters through the merge-rank BPE.
void Tokenizer::tokenize_bpe(std::string_view text, std::vector<TokenId>& out) const {
  const auto find_piece = [this](std::string_view piece) { return find(piece); };
  const auto byte_fallback = [this](uint8_t b) { return byte_token(b); };
  for (const std::string_view run : split_newline_runs(text)) bpe_->encode(run, find_piece, byte_fallback, out);
}

/// llama_vocab::impl::tokenize, SPM branch: BOS, then each fragment (split tokens as they are,
/// raw text with a space prefix after a special token when add_space_prefix, spaces escaped,
/// through the SPM session), then EOS when add_eos.
std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && add_bos_) {
    if (bos_ < 0) throw Error("tokenizer: add_bos is set but there is no BOS token");
    out.push_back(bos_);
  }
  bool prev_special = true;
  for (const Fragment& f : partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    std::string raw = add_space_prefix_ && prev_special ? " " : "";
    raw.append(text.substr(f.offset, f.length));
    const std::string escaped = replace_all(raw, " ", kSpaceMark);
    if (bpe_) {
      tokenize_bpe(escaped, out);
    } else {
      tokenize_raw(escaped, out);
    }
    prev_special = false;
  }
  if (add_special && add_eos_) {
    if (eos_ < 0) throw Error("tokenizer: add_eos is set but there is no EOS token");
    out.push_back(eos_);
  }
  return out;
}

// --- Decoding -------------------------------------------------------------------------------

void Tokenizer::check_id(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) {
    throw Error("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary of " +
                std::to_string(pieces_.size()) + " tokens");
  }
}

/// llama_vocab::impl::token_to_piece, SPM branch (lstrip 0).
std::string Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  check_id(id);
  if (control_[id] && !render_special) return "";
  const std::string& text = pieces_[id];
  const TokenType t = types_[id];
  if (control_[id] || t == TokenType::kUserDefined) return text;
  switch (t) {
    case TokenType::kNormal:
      return replace_all(text, kSpaceMark, " ");
    case TokenType::kByte: {
      // "<0xXX>" → byte XX; a byte token stored as the byte itself is returned as is.
      // strtol as llama.cpp's token_to_byte: malformed hex ("<0xZZ>") gives 0, never throws.
      if (text.size() == 6 && text.starts_with("<0x")) {
        const std::string hex = text.substr(3, 2);
        return std::string(1, static_cast<char>(std::strtol(hex.c_str(), nullptr, 16)));
      }
      return text;
    }
    default:
      return "";  // unused and undefined tokens render as nothing
  }
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool render_special) const {
  std::string out;
  for (const TokenId id : ids) out += token_to_piece(id, render_special);
  return out;
}

TokenType Tokenizer::type(TokenId id) const {
  check_id(id);
  return types_[id];
}

const std::string& Tokenizer::piece(TokenId id) const {
  check_id(id);
  return pieces_[id];
}

std::optional<TokenId> Tokenizer::find(std::string_view piece) const {
  const TokenId id = lookup(piece);
  if (id < 0) return std::nullopt;
  return id;
}

/// The slot holding `piece`, or the empty slot where it would go (`hash` = piece_hash(piece)).
/// Probing starts at the hash's low bits. A slot whose tag (the high 32 bits) differs holds
/// another piece, rejected without reading pieces_: that string compare costs a cache miss or
/// two, so it is left for the piece itself and tag collisions (one in 2^32).
size_t Tokenizer::probe(std::string_view piece, uint64_t hash) const {
  const size_t mask = index_.size() - 1;
  const auto tag = static_cast<uint32_t>(hash >> 32);
  for (size_t slot = hash & mask;; slot = (slot + 1) & mask) {
    const IndexSlot& at = index_[slot];
    if (at.id < 0 || (at.tag == tag && pieces_[static_cast<size_t>(at.id)] == piece)) return slot;
  }
}

TokenId Tokenizer::lookup(std::string_view piece) const {
  if (index_.empty()) return -1;
  return index_[probe(piece, piece_hash(piece))].id;
}

/// Fills index_ from pieces_. Each insertion into the table (4 MiB for Gemma's 262,144 pieces) is
/// a cache miss, which the CPU would wait for one at a time: computing the hashes first lets the
/// home slot of the piece kPrefetchAhead insertions later be prefetched, so that the misses
/// overlap.
void Tokenizer::build_index() {
  size_t slots = 16;
  while (slots < 2 * pieces_.size()) slots *= 2;
  index_.assign(slots, IndexSlot{});
  std::vector<uint64_t> hashes(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) hashes[i] = piece_hash(pieces_[i]);
  constexpr size_t kPrefetchAhead = 16;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (i + kPrefetchAhead < hashes.size()) {
      __builtin_prefetch(&index_[hashes[i + kPrefetchAhead] & (slots - 1)], /*rw=*/1);
    }
    // In id order: a later duplicate replaces the earlier id, as in llama.cpp's token_to_id.
    const std::string& piece = pieces_[i];
    index_[probe(piece, hashes[i])] = {static_cast<TokenId>(i), static_cast<uint32_t>(hashes[i] >> 32)};
  }
}

// --- Streaming ------------------------------------------------------------------------------

namespace {

/// Length of the longest prefix of `bytes` that does not end inside an incomplete UTF-8
/// sequence: a trailing lead byte whose continuation bytes have not all arrived is held back.
/// Invalid bytes (stray continuations, 0xF8..0xFF) are released as they are.
size_t complete_prefix(std::string_view bytes) {
  const size_t n = bytes.size();
  // Look back at most 4 bytes for the lead byte of the last sequence.
  for (size_t back = 1; back <= std::min<size_t>(n, 4); ++back) {
    const auto c = static_cast<uint8_t>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) {
      need = 2;
    } else if ((c & 0xF0) == 0xE0) {
      need = 3;
    } else if ((c & 0xF8) == 0xF0) {
      need = 4;
    }
    return back < need ? n - back : n;
  }
  return n;  // only continuation bytes at the end: nothing to wait for
}

}  // namespace

std::string StreamDecoder::push(TokenId id) {
  pending_ += tokenizer_->token_to_piece(id, render_special_);
  const size_t ready = complete_prefix(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

std::vector<TokenId> Tokenizer::stop_tokens() const {
  std::vector<TokenId> ids{eos()};
  for (const char* piece : {"<end_of_turn>", "<turn|>", "<|tool_response>"}) {
    if (auto id = find(piece); id && std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  }
  return ids;
}

}  // namespace kestrel::text
