// OpenAI's /v1/embeddings on the wire: the request (input as a string, strings, token ids or
// lists of them; encoding_format float or base64; dimensions) and the response object.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kestrel/server/request.h"

namespace kestrel::server {

/// Inputs per request at most (OpenAI's limit).
inline constexpr size_t kMaxEmbeddingInputs = 2048;

struct EmbeddingsRequest {
  std::string model;                  // empty when the client sent none
  PromptList inputs;                  // strings (tokenized with BOS) or token ids (used as they are)
  bool base64 = false;                // encoding_format "base64": little-endian float32 bytes, base64
  std::optional<int64_t> dimensions;  // the client's dimensions, checked against d_model by the caller
};

/// Validates a /v1/embeddings body. Throws ApiError (400) naming the field: a body that is not
/// an object, a missing or malformed input (parse_prompt_list, at most kMaxEmbeddingInputs),
/// an encoding_format other than float or base64, a model or user that is not a string,
/// dimensions that is not a positive integer. Unknown fields are ignored; null is absent.
EmbeddingsRequest parse_embeddings_request(const nlohmann::json& body);

/// RFC 4648 base64 of `floats`' bytes, little-endian float32 (what the openai client decodes).
std::string base64_floats(std::span<const float> floats);

/// OpenAI's response: {"object": "list", "data": [{"object": "embedding", "index": i,
/// "embedding": [...] or base64}], "model", "usage": {"prompt_tokens", "total_tokens"}}.
nlohmann::json embeddings_response(const std::vector<std::vector<float>>& vectors, bool base64,
                                   const std::string& model, size_t prompt_tokens);

}  // namespace kestrel::server
