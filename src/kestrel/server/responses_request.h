// POST /v1/responses (OpenAI's Responses API) as a chat completions request: one pipeline, two
// wire formats. The body is translated into a /v1/chat/completions body, which the chat path
// then validates, renders and runs; responses_format.h shapes the answer.
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace kestrel::server {

/// Stored responses (`store`, the default) for previous_response_id: the conversation a
/// response ended (chat messages, its own output included; the request's instructions are not
/// kept, as OpenAI does not carry them over) and the response object itself. In memory, at most
/// `capacity` entries, the least recently used dropped first; lost when the server stops.
/// Thread-safe.
class ResponseStore {
 public:
  explicit ResponseStore(size_t capacity) : capacity_(capacity) {}
  struct Entry {
    nlohmann::ordered_json messages;  // chat messages, ending with the response's assistant turn(s)
    nlohmann::json response;          // the response object as returned
  };
  void put(const std::string& id, Entry entry);
  std::optional<Entry> get(const std::string& id);
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::mutex mu_;
  std::list<std::string> order_;  // most recently used first
  std::unordered_map<std::string, std::pair<Entry, std::list<std::string>::iterator>> entries_;
};

/// What the Responses writer needs beyond the chat request.
struct ResponsesRequest {
  nlohmann::ordered_json chat;        // the equivalent /v1/chat/completions body
  nlohmann::ordered_json history;     // chat messages to store: previous ones, then this input's (no instructions)
  std::string previous_response_id;   // empty when none
  bool store = true;
  nlohmann::json echo;                // request fields the response object repeats (instructions, tools, ...)
};

/// Translates a Responses body (parsed with its keys in the client's order). `store` resolves
/// previous_response_id. Throws ApiError: 400 naming the field (input[2].type, text.format,
/// tools[0].type, ...), 404 for an unknown previous_response_id (never stored, or evicted).
ResponsesRequest responses_to_chat(const nlohmann::ordered_json& body, ResponseStore& store);

}  // namespace kestrel::server
