// Writing a Hugging Face tokenizer directory (tokenizer.json and friends) equivalent to the
// GGUF's SentencePiece-BPE tokenizer, so that Python tools (transformers.AutoTokenizer, AIPerf,
// lm-eval) count tokens exactly as Kestrel does, offline.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "kestrel/formats/gguf.h"

namespace kestrel::text {

/// tokenizer.json for `file`'s tokenizer (tokenizer.ggml.model "llama", Gemma 3's, or "gemma4"):
///  - model: BPE with byte_fallback over the GGUF vocabulary; merges: for "gemma4" the file's
///    tokenizer.ggml.merges in rank order; for "llama" derived from the scores: every split of
///    a piece into two vocabulary pieces is a merge, ranked by the piece's score (highest
///    first), which reproduces SentencePiece-BPE's highest-score-first merging;
///  - normalizer: " " -> U+2581 (no space prefix unless tokenizer.ggml.add_space_prefix);
///    pre-tokenizer: none for "llama" (SentencePiece does not split on whitespace); for
///    "gemma4" runs of newlines split from the rest (Split \n+, isolated; text/bpe.h);
///  - added_tokens: control and user-defined tokens, matched in the raw text first;
///  - post_processor: BOS prepended when the file says add_bos_token (add_special_tokens=True);
///  - decoder: U+2581 -> " ", byte fallback, fuse.
/// Throws kestrel::Error for an unsupported tokenizer model or inconsistent arrays.
nlohmann::json hf_tokenizer_json(const gguf::File& file);

/// The chat template tokenizer_config.json gets when the file carries none (a base model).
enum class MissingChatTemplate {
  kGemma3,  // Kestrel's Gemma 3 turn format (tools such as AIPerf need a template to format chats)
  kNone,    // none: a model checkpoint of a base model stays a base model when read back
};

/// Writes DIR/tokenizer.json, tokenizer_config.json (special tokens, model_max_length, the
/// chat template: the file's own, else as `missing` says), special_tokens_map.json.
/// Creates DIR. Throws kestrel::Error when a file cannot be written.
void export_hf_tokenizer(const gguf::File& file, const std::filesystem::path& dir, size_t model_max_length,
                         MissingChatTemplate missing = MissingChatTemplate::kGemma3);

/// Kestrel's Gemma 3 turn format as a Jinja chat template (what `kestrel serve` renders for a
/// model without tokenizer.chat_template), written for this project.
const std::string& gemma3_jinja_template();

}  // namespace kestrel::text
