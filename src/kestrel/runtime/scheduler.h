// Continuous batching: one thread owns the model and advances every running request together,
// one forward pass per step; callers (HTTP threads) only submit requests and receive what their
// request produces.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/generate_options.h"
#include "kestrel/runtime/prefix_cache.h"
#include "kestrel/runtime/session_pool.h"

namespace kestrel::runtime {

struct SchedulerOptions {
  size_t n_sessions = 4;      // sequences that run at once, each with its own KV cache
  /// Prompt tokens one request prefills per step while other requests are decoding: the bound
  /// on the gap a long prompt opens in the running streams (a prompt prefills in full-size
  /// ubatches when nothing else runs).
  size_t prefill_chunk = 64;
  /// Bytes of keys and values the prefix cache shared by all sessions may hold (runtime/
  /// prefix_cache.h; --cache-ram); 0: none (each session reuses only its own cache).
  size_t cache_ram = 0;
  /// Where the prefix cache keeps blocks that leave memory and finds them again after a restart
  /// (--cache-dir); empty: memory only.
  std::filesystem::path cache_dir{};
};

/// The requests waiting for a session and the ones running (for metrics gauges).
using LoadCallback = std::function<void(size_t waiting, size_t running)>;

class Scheduler {
 public:
  /// Allocates the sessions (kestrel::Error when their KV caches do not fit in memory) and
  /// starts the scheduling thread. `engine` must outlive the Scheduler, and nothing else may
  /// compute on it meanwhile.
  Scheduler(Engine& engine, const SchedulerOptions& options, LoadCallback on_load = nullptr);
  /// Stops the thread; requests still waiting or running end with kestrel::Error.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Runs one request as Session::generate does (same options, result and errors), joining the
  /// running batch at the next step: FIFO among waiting requests, each in the free session
  /// whose cache shares the longest prefix with its prompt (SessionPool), its cached prefix
  /// then taken from that session or the shared prefix cache, whichever holds more. A request
  /// whose prompt shares a longer prefix with one that is prefilling now waits until that prefix
  /// is in the prefix cache (so a crowd with one system prompt prefills it once). Blocks the caller;
  /// options.on_token and on_text are called on the caller's thread, in order, and returning
  /// false from either cancels this request only (within a step).
  GenerateResult run(std::span<const TokenId> prompt, const GenerateOptions& options,
                     const TextCallback& on_text = nullptr);

  size_t n_sessions() const { return pool_.size(); }
  size_t kv_bytes() const { return pool_.kv_bytes(); }
  /// The shared prefix cache's counters, or null without one (cache_ram 0). Thread-safe.
  const PrefixCacheStats* prefix_cache_stats() const { return prefix_cache_ ? &prefix_cache_->stats() : nullptr; }
  /// The prefix cache's block size in tokens (0 without one).
  size_t prefix_block_tokens() const { return prefix_cache_ ? prefix_cache_->block_tokens() : 0; }

 private:
  struct Job;
  void loop();
  void admit();
  void step();
  void complete(const std::shared_ptr<Job>& job, std::exception_ptr error);
  bool awaits_shared_prefix(const Job& job);
  void take_cached_prefix(Job& job);
  void report_load();

  Engine& engine_;
  SchedulerOptions options_;
  LoadCallback on_load_;
  SessionPool pool_;
  std::unique_ptr<PrefixCache> prefix_cache_;  // scheduler thread only (stats() from any)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;  // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  std::vector<std::shared_ptr<Job>> running_; // scheduler thread only
  std::thread thread_;
};

}  // namespace kestrel::runtime
