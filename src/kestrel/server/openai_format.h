// Shaping results as OpenAI does: response objects, stream chunks, SSE framing, logprobs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/runtime/logprobs.h"
#include "kestrel/text/tokenizer.h"

namespace kestrel::server {

/// Serializes JSON for the wire; invalid UTF-8 (a token cut inside a character) is replaced
/// by U+FFFD instead of throwing.
std::string dump(const nlohmann::json& j);

/// One Server-Sent Event: "data: {json}\n\n" (LF framing, as OpenAI and AIPerf expect).
std::string sse_event(const nlohmann::json& j);
/// The stream's end: "data: [DONE]\n\n".
std::string sse_done();

/// Identity of one response, shared by all its chunks.
struct ResponseMeta {
  std::string id;        // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;   // Unix seconds
  std::string model;
};

/// OpenAI's usage object. Speculative decoding's counts go where OpenAI reports predicted
/// outputs: completion_tokens_details.accepted_prediction_tokens (drafted tokens kept) and
/// rejected_prediction_tokens (drafted tokens verified and dropped). accepted <= drafted.
nlohmann::json usage_json(size_t prompt_tokens, size_t completion_tokens, size_t cached_tokens,
                          size_t drafted_tokens = 0, size_t accepted_tokens = 0);

/// A chat.completion.chunk with one choice (index 0) carrying `delta`; finish_reason null
/// when empty. `logprobs` (chat shape, or null) goes on the choice. include_usage adds
/// "usage": null, as OpenAI does on every chunk but the last when usage was asked for.
nlohmann::json chat_chunk(const ResponseMeta& meta, const nlohmann::json& delta, const std::string& finish_reason,
                          const nlohmann::json& logprobs, bool include_usage);
/// The final chunk of a stream with stream_options.include_usage: empty choices and usage.
nlohmann::json usage_chunk(const ResponseMeta& meta, const char* object, const nlohmann::json& usage);
/// A text_completion chunk (or, with finish_reason set and full text, one choice of a response).
nlohmann::json completion_choice(size_t index, const std::string& text, const std::string& finish_reason,
                                 const nlohmann::json& logprobs);
nlohmann::json completion_object(const ResponseMeta& meta, nlohmann::json choices, const nlohmann::json& usage);

/// Chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}.
nlohmann::json chat_logprobs(const text::Tokenizer& tokenizer, const std::vector<runtime::StepLogprobs>& steps);
/// Completions logprobs: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.
/// text_offset counts bytes from `offset0`.
nlohmann::json completion_logprobs(const text::Tokenizer& tokenizer, const std::vector<runtime::StepLogprobs>& steps,
                                   size_t offset0);

/// Completions logprobs of an echoed prompt followed by the generated tokens (OpenAI's echo:
/// true with logprobs): `prompt` is every prompt token, `prompt_steps` the scores of all but the
/// first (runtime::GenerateResult::prompt_logprobs), whose token_logprobs and top_logprobs are
/// null. text_offset counts bytes of the pieces from 0.
nlohmann::json echo_completion_logprobs(const text::Tokenizer& tokenizer, std::span<const runtime::TokenId> prompt,
                                        const std::vector<runtime::StepLogprobs>& prompt_steps,
                                        const std::vector<runtime::StepLogprobs>& generated);

/// vLLM's prompt_logprobs: [null, {"ID": {"logprob", "rank", "decoded_token"}, ...}, ...], one
/// entry per prompt token; each holds the prompt token (with its rank in the vocabulary) and
/// the alternatives (ranks 1, 2, ...).
nlohmann::json vllm_prompt_logprobs(const text::Tokenizer& tokenizer, const std::vector<runtime::StepLogprobs>& steps,
                                    const std::vector<uint32_t>& ranks);

}  // namespace kestrel::server
