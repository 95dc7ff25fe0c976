// The access log of `kestrel serve`: one line per HTTP request on stderr, as text or JSON.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace kestrel::server {

enum class LogFormat { kText, kJson };

/// "text" or "json"; throws kestrel::Error for anything else.
LogFormat parse_log_format(const std::string& name);

/// What one request did, collected on its connection thread while it runs (cpp-httplib runs a
/// request's routing, handler, content provider and logger on one thread).
struct RequestRecord {
  std::chrono::steady_clock::time_point start{};
  size_t prompt_tokens = 0;      // prompt tokens of every generation the request ran
  size_t cached_tokens = 0;      // of them, the ones a KV cache already held
  size_t completion_tokens = 0;  // generated tokens
  bool generated = false;        // the request ran a generation (else no token fields)
};

/// The record of the request the calling thread is serving.
RequestRecord& current_request();

/// One line (no trailing newline):
///   text: 2026-12-05T17:04:48.123Z 127.0.0.1 "POST /v1/chat/completions" 200 prompt=12 cached=0 completion=34 ms=123.4
///   json: {"time":"...","remote":"127.0.0.1","method":"POST","path":"/v1/chat/completions","status":200,
///          "prompt_tokens":12,"cached_tokens":0,"completion_tokens":34,"ms":123.4}
/// Token fields only when record.generated; ms is wall time from record.start to now.
std::string access_line(LogFormat format, const std::string& remote, const std::string& method,
                        const std::string& path, int status, const RequestRecord& record);

/// Writes `line` and a newline to stderr in one call (lines of concurrent requests never mix).
void write_log_line(const std::string& line);

}  // namespace kestrel::server
