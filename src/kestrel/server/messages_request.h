// POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) as a chat
// completions request: the body is translated into a /v1/chat/completions body, which the chat
// path validates, renders and runs; reply_builder.h's MessagesBuilder shapes the answer.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kestrel::server {

struct MessagesRequest {
  nlohmann::ordered_json chat;            // the equivalent /v1/chat/completions body
  std::string model;                      // as the client named it (echoed, not checked)
  std::vector<std::string> stop_sequences;
};

/// Translates a Messages body (keys in the client's order): system (a string or text blocks),
/// messages of role user / assistant with content a string or blocks (text, tool_use,
/// tool_result), tools (name, description, input_schema), tool_choice (auto, any, tool, none),
/// stop_sequences, max_tokens (required unless `count_only`), temperature, top_p, top_k,
/// stream. Throws ApiError 400 naming the field (messages[1].content[0].type, ...).
MessagesRequest messages_to_chat(const nlohmann::ordered_json& body, bool count_only);

/// Anthropic's error body: {"type": "error", "error": {"type", "message"}}; the type for an
/// HTTP status (400 invalid_request_error, 401 authentication_error, 403 permission_error, 404
/// not_found_error, 413 request_too_large, 429 rate_limit_error, 503/529 overloaded_error, else
/// api_error).
nlohmann::json anthropic_error(int status, const std::string& message);

}  // namespace kestrel::server
