// Server metrics in the Prometheus text exposition format (GET /metrics).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kestrel/head/flashhead.h"
#include "kestrel/runtime/prefix_cache.h"

namespace kestrel::server {

/// A cumulative histogram with fixed upper bounds (seconds), Prometheus style.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double value);
  /// Lines `name_bucket{le=...}`, `name_sum`, `name_count`, with HELP and TYPE.
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, the last one +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

/// Every metric of the server; all methods are thread-safe.
class Metrics {
 public:
  Metrics();
  /// One finished HTTP request of an API endpoint ("chat", "completions", ...) with its status.
  void request(const std::string& endpoint, int status);
  /// Any HTTP response the server sent, by status: every path (unknown ones, /health, /metrics,
  /// the chat page) and every status, 404s and 413s included.
  void response(int status);
  void tokens(size_t prompt_tokens, size_t generated_tokens);
  void ttft(double seconds);           // request arrival to the first generated token
  void inter_token(double seconds);    // between consecutive generated tokens of one request
  void request_latency(double seconds);
  void load(size_t waiting, size_t running);  // requests waiting for a session, and generating
  void cancelled();                    // a client went away during generation
  void prompt_cache(size_t cached_tokens);  // a prompt ran; cached_tokens of it came from a KV cache
  void drafts(size_t drafted, size_t accepted);  // speculative decoding: tokens drafted and accepted
  /// Structured output with FlashHead: steps that scored exactly the grammar's few allowed
  /// tokens, and steps where no candidate was allowed and the dense head scored the step.
  void grammar_steps(size_t exact, size_t dense);
  void sessions(size_t n, size_t kv_bytes); // the sessions allocated and their KV cache bytes
  /// The shared prefix cache (--cache-ram) whose counters render() reads; null: none. `stats`
  /// must outlive this object's render() calls (the scheduler's).
  void prefix_cache(const runtime::PrefixCacheStats* stats, size_t max_bytes);
  /// The model's FlashHead, whose search counters (head::ProofStats: searches, clusters scored,
  /// searches by how their greedy token was proven) and probe floor render() reads; null: the
  /// dense head. `flash` must outlive this object's render() calls (the engine's).
  void flashhead(const head::FlashHead* flash, size_t probes);
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<int, uint64_t> responses_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0, cancelled_ = 0;
  uint64_t cache_hits_ = 0, cache_misses_ = 0, cached_tokens_ = 0;
  uint64_t drafted_ = 0, accepted_ = 0;
  uint64_t grammar_exact_ = 0, grammar_dense_ = 0;
  size_t sessions_ = 0, kv_bytes_ = 0;
  const runtime::PrefixCacheStats* prefix_ = nullptr;
  size_t prefix_max_bytes_ = 0;
  const head::FlashHead* flash_ = nullptr;
  size_t probes_ = 0;
  int64_t queue_depth_ = 0, running_ = 0;
  Histogram ttft_, itl_, latency_;
};

}  // namespace kestrel::server
