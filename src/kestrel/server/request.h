// Parsing and validating OpenAI requests (/v1/chat/completions, /v1/completions) into a
// GenerationRequest. Unknown fields are ignored; a known field of the wrong type or out of
// range is a 400 that names it; null counts as absent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/runtime/grammar.h"
#include "kestrel/runtime/sampler.h"
#include "kestrel/text/chat_tools.h"

namespace kestrel::server {

enum class Endpoint { kChat, kCompletion };

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;                        // empty when the client sent none

  // /v1/chat/completions
  std::vector<text::Message> messages;
  std::vector<text::ToolDefinition> tools;  // empty when tool_choice is "none"
  std::string tool_choice = "auto";         // none, auto, required, or the forced function's name
  bool tool_choice_named = false;           // tool_choice names a function (even one named "required")
  /// Several calls in one reply only when the request sets parallel_tool_calls: true (llama-server's
  /// default; OpenAI's is true, but a small model then repeats a forced call until the bound).
  /// A named tool_choice makes exactly one call either way.
  bool parallel_tool_calls = false;
  bool enable_thinking = false;             // chat_template_kwargs.enable_thinking (Gemma 4)
  bool json_object = false;                 // response_format {"type": "json_object"}

  // /v1/completions: one entry per prompt; text or token ids
  std::vector<std::string> prompt_texts;
  std::vector<std::vector<int32_t>> prompt_ids;
  bool echo = false;                        // the prompt comes back before the completion (scoring)
  int prompt_logprobs = -1;                 // vLLM's prompt_logprobs: alternatives per prompt token, -1 none

  std::optional<size_t> max_tokens;         // max_completion_tokens, else max_tokens
  runtime::SamplerConfig sampler;           // OpenAI defaults: temperature 1, no top-k/p/min-p cut
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  size_t n = 1;                             // choices per prompt
  size_t best_of = 1;                       // completions: samples per prompt, the n most likely returned
  bool stream = false;
  bool include_usage = false;               // stream_options.include_usage
  bool ignore_eos = false;
  bool cache_prompt = true;                 // reuse a session's cached prefix (llama-server's name)
  size_t min_tokens = 0;
  int top_logprobs = -1;                    // -1: no logprobs; 0: chosen token only; n: n best
  /// logit_bias: {"token id": bias in [-100, 100]}, ids ascending (checked against the
  /// vocabulary by the server, which knows it).
  std::vector<std::pair<int64_t, float>> logit_bias;

  // Structured output, both endpoints: response_format json_object / json_schema, llama-server's
  // json_schema / grammar, or vLLM's structured_outputs {json, regex, choice, grammar} and
  // guided_json / guided_regex / guided_choice / guided_grammar (at most one). Enforced while
  // sampling.
  std::optional<runtime::GrammarSpec> grammar;
  std::string grammar_param;                // the field it came from, for errors
  std::string schema_pointer;               // a JSON Schema's JSON pointer in the body
};

/// Limits checked by the parser.
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr int kMaxTopLogprobs = 20;
inline constexpr size_t kMaxPrompts = 64;
/// n and best_of at most (several samples of one prompt run as concurrent requests, batched).
inline constexpr size_t kMaxSamples = 16;
inline constexpr size_t kMaxLogitBias = 1024;  // entries of logit_bias (OpenAI allows 300)

/// Deepest nesting of arrays and objects in JSON text (strings skipped), without parsing it:
/// bodies nested deeper than kMaxJsonDepth are refused before anything recurses over them.
size_t json_nesting_depth(std::string_view text);
inline constexpr size_t kMaxJsonDepth = 64;

/// Validates a /v1/chat/completions body. Throws ApiError (400) naming the field: a body that
/// is not an object, missing or empty messages, a wrong type, a value out of range, n != 1,
/// image parts, more than one structured-output field, a response_format json_schema without
/// a schema object. (Whether a schema or grammar compiles is checked when it is compiled.)
GenerationRequest parse_chat_request(const nlohmann::json& body);

/// The JSON Schema at `pointer` (GenerationRequest::schema_pointer) re-read from the raw body
/// with its keys in the client's order (the parsed body sorts them, and a schema's property
/// order is the order the answer writes them in).
std::string schema_in_client_order(std::string_view raw_body, const std::string& pointer);

/// Prompts as /v1/completions' `prompt` and /v1/embeddings' `input` take them: a string, an
/// array of strings, an array of token ids, or an array of arrays of token ids.
struct PromptList {
  std::vector<std::string> texts;         // the strings, or empty
  std::vector<std::vector<int32_t>> ids;  // the token-id lists, or empty (ids are checked >= 0 only)
};
/// Reads `v` (the field `name`) into a PromptList. Throws ApiError (400) naming the field for
/// another type, an empty array or token-id list, a negative or non-integer id, or more than
/// `max_items` strings or lists.
PromptList parse_prompt_list(const nlohmann::json& v, const std::string& name, size_t max_items);

/// Validates a /v1/completions body; prompt is a string, an array of strings, an array of
/// token ids or an array of arrays of token ids. echo and prompt_logprobs (0 to
/// kMaxTopLogprobs) score the prompt; neither streams. Throws ApiError (400) as
/// parse_chat_request.
GenerationRequest parse_completion_request(const nlohmann::json& body);

}  // namespace kestrel::server
