// Continuous batching: one thread owns the model and advances every running request together,
// one forward pass per step; callers (HTTP threads) only submit requests and receive what their
// request produces.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/generate_options.h"
#include "kestrel/runtime/session_pool.h"

namespace kestrel::runtime {

struct SchedulerOptions {
  size_t n_sessions = 4;      // sequences that run at once, each with its own KV cache
  /// Prompt tokens one request prefills per step while other requests are decoding: the bound
  /// on the gap a long prompt opens in the running streams (a prompt prefills in full-size
  /// ubatches when nothing else runs).
  size_t prefill_chunk = 64;
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
  /// whose cache shares the longest prefix with its prompt (SessionPool). Blocks the caller;
  /// options.on_token and on_text are called on the caller's thread, in order, and returning
  /// false from either cancels this request only (within a step).
  GenerateResult run(std::span<const TokenId> prompt, const GenerateOptions& options,
                     const TextCallback& on_text = nullptr);

  size_t n_sessions() const { return pool_.size(); }
  size_t kv_bytes() const { return pool_.kv_bytes(); }

 private:
  struct Job;
  void loop();
  void admit();
  void step();
  void complete(const std::shared_ptr<Job>& job, std::exception_ptr error);
  void report_load();

  Engine& engine_;
  SchedulerOptions options_;
  LoadCallback on_load_;
  SessionPool pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;  // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  std::vector<std::shared_ptr<Job>> running_; // scheduler thread only
  std::thread thread_;
};

}  // namespace kestrel::runtime
