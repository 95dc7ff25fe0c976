// A persistent pool of worker threads for data-parallel loops.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace kestrel {

/// Runs `fn(begin, end)` over disjoint slices of [0, n) on a fixed set of threads (the caller
/// is one of them). Workers stay alive between calls and spin briefly before sleeping, so the
/// ~150 parallel loops of a decode step cost microseconds, not thread creations.
/// Not re-entrant: one parallel_for at a time per pool.
///
/// KESTREL_POOL_STATS=1 prints, when the pool is destroyed, where the calling thread's time went:
/// the loops, its wait for the other threads after its own share (imbalance and wake-up), and
/// the serial time between loops (gaps under 1 ms: the single-threaded work inside a step), and
/// per loop body (the lambda's type, demangled) the same loop time and wait, largest wait first:
/// which loops leave a thread idle.
class ThreadPool {
 public:
  static constexpr int kMaxThreads = 256;
  /// n_threads <= 0 means every hardware thread. Throws kestrel::Error above kMaxThreads.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  /// Splits [0, n) into at most size() contiguous chunks whose bounds are multiples of `grain`
  /// (except the last) and runs them in parallel; returns when all are done.
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

  /// parallel_for with the chunks handed out as threads become free: each thread takes the next
  /// `grain` items until none are left. For loops whose items cost unequal time (memory-bound
  /// reads of scattered rows), where static halves leave one thread waiting for the other.
  /// fn(begin, end) sees chunks of `grain` items (the last may be shorter), in no fixed order
  /// and on any thread.
  void parallel_for_dynamic(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

 private:
  void worker_loop(int index);
  void run_chunk(int index);
  /// Wakes the workers on the job set in job_*, runs the caller's share, waits for the rest.
  void start_and_join();

  // KESTREL_POOL_STATS: the caller's time, in nanoseconds.
  struct Stats {
    bool on = false;
    uint64_t loops = 0, in_loops_ns = 0, waited_ns = 0, serial_ns = 0;
    int64_t last_end_ns = -1;
  };
  Stats stats_;
  // KESTREL_POOL_STATS per loop body, keyed by the body's type name (std::type_info::name()).
  struct SiteStats {
    uint64_t loops = 0, in_loops_ns = 0, waited_ns = 0;
  };
  std::unordered_map<const char*, SiteStats> site_stats_;
  void print_stats() const;

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  // The current job (valid while pending_ > 0).
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0;
  size_t job_chunk_ = 0;
  bool job_dynamic_ = false;            // chunks of job_chunk_ items claimed from job_next_
  std::atomic<size_t> job_next_{0};
};

}  // namespace kestrel
