// Benchmark prompts: exact-length windows cut from tokenized real text.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include "kestrel/runtime/bench/methodology.h"
#include "kestrel/text/tokenizer.h"

namespace kestrel::runtime::bench {

/// Cuts `count` prompts of exactly `n` tokens from `stream`: prompt k is `bos` (when given)
/// followed by the next n - 1 (or n without `bos`) tokens of the stream, the windows taken one
/// after another from the start and never overlapping, so no two prompts share text.
/// Throws kestrel::Error when n is 0 (or 1 with `bos`), or the stream is too short.
std::vector<std::vector<TokenId>> cut_prompts(std::span<const TokenId> stream, std::optional<TokenId> bos,
                                              size_t n, size_t count);

/// The whole text of `path` (a text file as is, or for an OpenAssistant .jsonl the "text" of
/// its non-deleted rows in file order joined by blank lines), tokenized once by `tokenizer`
/// without BOS and without parsing control tokens. Throws kestrel::Error if it cannot be read or
/// holds no text.
std::vector<TokenId> text_token_stream(const text::Tokenizer& tokenizer, const std::filesystem::path& path);

/// The prompts of `spec` (spec.prompts_needed() of them) cut from `stream` with the tokenizer's BOS.
std::vector<std::vector<TokenId>> suite_prompts(const SuiteSpec& spec, std::span<const TokenId> stream,
                                                const text::Tokenizer& tokenizer);

}  // namespace kestrel::runtime::bench
