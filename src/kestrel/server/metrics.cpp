#include "kestrel/server/metrics.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace kestrel::server {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Resident set size from /proc/self/statm (its second field, in pages); 0 where unreadable.
uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  const long page = sysconf(_SC_PAGESIZE);
  return resident_pages * static_cast<uint64_t>(page > 0 ? page : 4096);
}

}  // namespace

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::string out = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum " + number(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
  return out;
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28}),
      latency_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}) {}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::response(int status) {
  std::lock_guard lock(mu_);
  ++responses_[status];
}

void Metrics::tokens(size_t prompt_tokens, size_t generated_tokens) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += prompt_tokens;
  generated_tokens_ += generated_tokens;
}

void Metrics::ttft(double seconds) {
  std::lock_guard lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::inter_token(double seconds) {
  std::lock_guard lock(mu_);
  itl_.observe(seconds);
}

void Metrics::request_latency(double seconds) {
  std::lock_guard lock(mu_);
  latency_.observe(seconds);
}

void Metrics::load(size_t waiting, size_t running) {
  std::lock_guard lock(mu_);
  queue_depth_ = static_cast<int64_t>(waiting);
  running_ = static_cast<int64_t>(running);
}

void Metrics::cancelled() {
  std::lock_guard lock(mu_);
  ++cancelled_;
}

void Metrics::prompt_cache(size_t cached_tokens) {
  std::lock_guard lock(mu_);
  ++(cached_tokens > 0 ? cache_hits_ : cache_misses_);
  cached_tokens_ += cached_tokens;
}

void Metrics::drafts(size_t drafted, size_t accepted) {
  std::lock_guard lock(mu_);
  drafted_ += drafted;
  accepted_ += accepted;
}

void Metrics::grammar_steps(size_t exact, size_t dense) {
  std::lock_guard lock(mu_);
  grammar_exact_ += exact;
  grammar_dense_ += dense;
}

void Metrics::sessions(size_t n, size_t kv_bytes) {
  std::lock_guard lock(mu_);
  sessions_ = n;
  kv_bytes_ = kv_bytes;
}

void Metrics::prefix_cache(const runtime::PrefixCacheStats* stats, size_t max_bytes) {
  std::lock_guard lock(mu_);
  prefix_ = stats;
  prefix_max_bytes_ = max_bytes;
}

void Metrics::flashhead(const head::FlashHead* flash, size_t probes) {
  std::lock_guard lock(mu_);
  flash_ = flash;
  probes_ = probes;
}

std::string Metrics::render() const {
  std::lock_guard lock(mu_);
  std::string out;
  out += "# HELP kestrel_requests_total HTTP requests to the API endpoints, by endpoint and status.\n"
         "# TYPE kestrel_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out += "kestrel_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
           std::to_string(n) + "\n";
  }
  out += "# HELP kestrel_http_responses_total Every HTTP response sent (any path, unknown ones included), by status.\n"
         "# TYPE kestrel_http_responses_total counter\n";
  for (const auto& [status, n] : responses_) {
    out += "kestrel_http_responses_total{status=\"" + std::to_string(status) + "\"} " + std::to_string(n) + "\n";
  }
  // One unlabelled sample with its HELP and TYPE lines.
  auto sample = [&out](const char* name, const char* type, const char* help, uint64_t value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    out += std::string(name) + " " + std::to_string(value) + "\n";
  };
  sample("kestrel_prompt_tokens_total", "counter", "Prompt tokens, cached ones included.", prompt_tokens_);
  out += "# HELP kestrel_prompt_cache_requests_total Prompts run, by whether a session's KV cache supplied a prefix.\n"
         "# TYPE kestrel_prompt_cache_requests_total counter\n";
  out += "kestrel_prompt_cache_requests_total{result=\"hit\"} " + std::to_string(cache_hits_) + "\n";
  out += "kestrel_prompt_cache_requests_total{result=\"miss\"} " + std::to_string(cache_misses_) + "\n";
  sample("kestrel_prompt_tokens_cached_total", "counter",
         "Prompt tokens taken from a KV cache instead of prefilled.", cached_tokens_);
  sample("kestrel_draft_tokens_total", "counter", "Tokens drafted for speculative decoding and verified.", drafted_);
  sample("kestrel_draft_accepted_tokens_total", "counter", "Drafted tokens that were the model's own (kept).",
         accepted_);
  sample("kestrel_grammar_exact_steps_total", "counter",
         "Structured output with FlashHead: steps whose few allowed tokens were scored exactly instead of the "
         "candidates.", grammar_exact_);
  sample("kestrel_grammar_dense_steps_total", "counter",
         "Structured output with FlashHead: steps where the grammar allowed no candidate and the dense head scored "
         "the step.", grammar_dense_);
  if (prefix_ != nullptr) {
    const runtime::PrefixCacheStats& p = *prefix_;
    sample("kestrel_prefix_cache_bytes", "gauge", "Bytes of keys and values in the shared prefix cache (--cache-ram).",
           p.bytes);
    sample("kestrel_prefix_cache_max_bytes", "gauge", "The shared prefix cache's bound (--cache-ram).", prefix_max_bytes_);
    sample("kestrel_prefix_cache_blocks", "gauge", "Blocks of prompt positions in the shared prefix cache.", p.blocks);
    sample("kestrel_prefix_cache_lookups_total", "counter", "Requests that looked their prompt up in the shared prefix cache.",
           p.lookups);
    sample("kestrel_prefix_cache_hits_total", "counter",
           "Requests whose prompt prefix was copied from the shared prefix cache.", p.hits);
    sample("kestrel_prefix_cache_restored_tokens_total", "counter",
           "Prompt positions copied from the shared prefix cache instead of prefilled.", p.restored_tokens);
    sample("kestrel_prefix_cache_stored_blocks_total", "counter", "Blocks added to the shared prefix cache.",
           p.stored_blocks);
    sample("kestrel_prefix_cache_evicted_blocks_total", "counter",
           "Blocks dropped from memory, least recently used first, to stay within --cache-ram.", p.evicted_blocks);
    sample("kestrel_prefix_cache_disk_writes_total", "counter", "Blocks written to --cache-dir.", p.disk_writes);
    sample("kestrel_prefix_cache_disk_reads_total", "counter", "Blocks read back from --cache-dir.", p.disk_reads);
    sample("kestrel_prefix_cache_disk_rejected_total", "counter",
           "Files of --cache-dir ignored (damaged, or written for another model).", p.disk_rejected);
  }
  if (flash_ != nullptr) {
    // FlashHead's searches (docs/flashhead.md): clusters scored per search = the probes plus the
    // greedy proof's extra rounds (or every cluster where the proof fell back to the dense head).
    const head::ProofStats f = flash_->proof_stats();
    sample("kestrel_flashhead_probes", "gauge", "FlashHead's probes per search (--probes; the floor with the proof).",
           probes_);
    sample("kestrel_flashhead_searches_total", "counter", "Hidden states FlashHead searched (a token each).",
           f.searches);
    sample("kestrel_flashhead_clusters_scored_total", "counter",
           "Clusters FlashHead scored, summed over its searches (mean probes per token = this / searches).", f.clusters);
    out += "# HELP kestrel_flashhead_searches_by_proof_total FlashHead searches by how their greedy token was proven "
           "(--flashhead-proof): at the probes (floor), with extra probes, by the dense fallback, or not proven "
           "(none: the proof is off or unavailable).\n"
           "# TYPE kestrel_flashhead_searches_by_proof_total counter\n";
    const std::pair<const char*, uint64_t> by_proof[] = {
        {"floor", f.floor}, {"extra", f.extra}, {"dense", f.dense}, {"none", f.none}};
    for (const auto& [proof, n] : by_proof) {
      out += std::string("kestrel_flashhead_searches_by_proof_total{proof=\"") + proof + "\"} " + std::to_string(n) + "\n";
    }
  }
  sample("kestrel_sessions", "gauge", "Sessions (KV caches) the server holds (--parallel).", sessions_);
  sample("kestrel_kv_cache_bytes", "gauge", "Bytes of all sessions' KV caches.", kv_bytes_);
  sample("process_resident_memory_bytes", "gauge",
         "Resident memory of the server process (weights, KV caches, buffers).", resident_bytes());
  sample("kestrel_generation_tokens_total", "counter", "Tokens generated.", generated_tokens_);
  sample("kestrel_requests_cancelled_total", "counter", "Generations stopped because the client went away.",
         cancelled_);
  sample("kestrel_queue_depth", "gauge", "Requests waiting for a session (FIFO).", static_cast<uint64_t>(queue_depth_));
  sample("kestrel_requests_running", "gauge", "Requests generating now (batched together).",
         static_cast<uint64_t>(running_));
  out += ttft_.render("kestrel_time_to_first_token_seconds", "Request arrival to the first generated token (TTFT).");
  out += itl_.render("kestrel_inter_token_latency_seconds", "Time between consecutive generated tokens (ITL).");
  out += latency_.render("kestrel_request_duration_seconds", "Request arrival to the last token.");
  return out;
}

}  // namespace kestrel::server
