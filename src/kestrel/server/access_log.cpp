#include "kestrel/server/access_log.h"

#include <cstdio>
#include <ctime>
#include <mutex>

#include <nlohmann/json.hpp>

#include "kestrel/base/error.h"

namespace kestrel::server {
namespace {

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

}  // namespace

LogFormat parse_log_format(const std::string& name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  throw Error("--log-format must be text or json, got '" + name + "'");
}

RequestRecord& current_request() {
  static thread_local RequestRecord record;
  return record;
}

std::string access_line(LogFormat format, const std::string& remote, const std::string& method,
                        const std::string& path, int status, const RequestRecord& record) {
  const auto now = std::chrono::steady_clock::now();
  const double ms = record.start == std::chrono::steady_clock::time_point{}
                        ? 0.0
                        : std::chrono::duration<double, std::milli>(now - record.start).count();
  const double ms_rounded = static_cast<double>(static_cast<long long>(ms * 10.0 + 0.5)) / 10.0;
  if (format == LogFormat::kJson) {
    nlohmann::ordered_json j = {{"time", utc_now()}, {"remote", remote}, {"method", method},
                                {"path", path},      {"status", status}};
    if (record.generated) {
      j["prompt_tokens"] = record.prompt_tokens;
      j["cached_tokens"] = record.cached_tokens;
      j["completion_tokens"] = record.completion_tokens;
    }
    j["ms"] = ms_rounded;
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  // The path goes in quotes with its quotes and control characters escaped, so that a client
  // cannot forge a line.
  std::string quoted;
  for (char ch : method + " " + path) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      quoted += '\\';
      quoted += ch;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      quoted += buf;
    } else {
      quoted += ch;
    }
  }
  std::string line = utc_now() + " " + remote + " \"" + quoted + "\" " + std::to_string(status);
  if (record.generated) {
    line += " prompt=" + std::to_string(record.prompt_tokens) + " cached=" + std::to_string(record.cached_tokens) +
            " completion=" + std::to_string(record.completion_tokens);
  }
  char ms_text[32];
  std::snprintf(ms_text, sizeof ms_text, " ms=%.1f", ms_rounded);
  return line + ms_text;
}

void write_log_line(const std::string& line) {
  static std::mutex mu;
  std::lock_guard lock(mu);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace kestrel::server
