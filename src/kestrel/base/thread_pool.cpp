#include "kestrel/base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>

#if defined(__GNUG__)
#include <cxxabi.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "kestrel/base/error.h"

namespace kestrel {
namespace {

// One step of a busy wait: the CPU's spin-wait hint (x86 `pause`: yields the core's pipeline
// to its sibling and saves power without leaving the thread). Decode waits at a barrier for
// microseconds, far less than a sched_yield system call's round trip.
inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Busy-wait steps before a waiter falls back to sched_yield (a few hundred microseconds).
constexpr int kPauseSpins = 1 << 14;

// Step `spin` (0, 1, ...) of a wait: the pause hint first, then sched_yield.
inline void wait_step(int spin) {
  if (spin < kPauseSpins) {
    spin_pause();
  } else {
    std::this_thread::yield();
  }
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A loop body's readable name: its lambda type demangled, the enclosing function's parameters
// and anonymous namespaces left out ("kestrel::kernels::matmul_same_input(...)::{lambda(unsigned
// long, unsigned long)#2}" becomes "kestrel::kernels::matmul_same_input {lambda #2}").
std::string loop_name(const char* name) {
  std::string s = name;
#if defined(__GNUG__)
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status == 0 && d != nullptr) {
    s = d;
    std::free(d);
  }
#endif
  constexpr std::string_view kAnonymous = "(anonymous namespace)::";
  for (size_t at; (at = s.find(kAnonymous)) != std::string::npos;) s.erase(at, kAnonymous.size());
  // A lambda's type: "<enclosing function>(<parameters>)::{lambda(<parameters>)#N}".
  const size_t lambda = s.find("::{lambda");
  const size_t hash = s.rfind('#');
  if (lambda == std::string::npos || hash == std::string::npos || hash < lambda) return s;
  return s.substr(0, std::min(lambda, s.find('('))) + " {lambda #" + s.substr(hash + 1);
}

bool stats_requested() {
  const char* v = std::getenv("KESTREL_POOL_STATS");
  return v != nullptr && *v != '\0' && *v != '0';
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  stats_.on = stats_requested();
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (n_threads > kMaxThreads) {
    throw Error("thread count " + std::to_string(n_threads) + " is over the maximum of " +
                std::to_string(kMaxThreads));
  }
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

void ThreadPool::print_stats() const {
  const auto ms = [](uint64_t ns) { return static_cast<double>(ns) / 1e6; };
  std::fprintf(stderr,
               "thread pool (%d threads): %llu parallel loops, %.1f ms in them (%.2f us each), the caller "
               "waiting %.1f ms of it for the others; %.1f ms serial between loops (gaps under 1 ms)\n",
               n_threads_, static_cast<unsigned long long>(stats_.loops), ms(stats_.in_loops_ns),
               ms(stats_.in_loops_ns) * 1e3 / static_cast<double>(stats_.loops), ms(stats_.waited_ns),
               ms(stats_.serial_ns));
  std::vector<std::pair<const char*, SiteStats>> sites(site_stats_.begin(), site_stats_.end());
  std::sort(sites.begin(), sites.end(), [](const auto& a, const auto& b) { return a.second.waited_ns > b.second.waited_ns; });
  constexpr size_t kSitesShown = 8;
  for (size_t i = 0; i < std::min(sites.size(), kSitesShown); ++i) {
    const SiteStats& st = sites[i].second;
    std::fprintf(stderr, "  %9.1f ms waited of %9.1f ms in %8llu loops: %s\n", ms(st.waited_ns), ms(st.in_loops_ns),
                 static_cast<unsigned long long>(st.loops), loop_name(sites[i].first).c_str());
  }
}

ThreadPool::~ThreadPool() {
  if (stats_.on && stats_.loops > 0) print_stats();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunk(int index) {
  if (job_dynamic_) {
    for (;;) {
      const size_t begin = job_next_.fetch_add(job_chunk_, std::memory_order_relaxed);
      if (begin >= job_n_) return;
      (*job_)(begin, std::min(job_n_, begin + job_chunk_));
    }
  }
  const size_t begin = static_cast<size_t>(index) * job_chunk_;
  const size_t end = std::min(job_n_, begin + job_chunk_);
  if (begin < end) (*job_)(begin, end);
}

void ThreadPool::parallel_for(size_t n, size_t grain,
                              const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t n_grains = (n + grain - 1) / grain;
  if (n_threads_ == 1 || n_grains == 1) {
    fn(0, n);
    return;
  }
  const size_t per_thread = (n_grains + n_threads_ - 1) / n_threads_;
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = per_thread * grain;
  job_dynamic_ = false;
  start_and_join();
}

void ThreadPool::parallel_for_dynamic(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  if (n_threads_ == 1 || n <= grain) {
    for (size_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain));
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = grain;
  job_dynamic_ = true;
  job_next_.store(0, std::memory_order_relaxed);
  start_and_join();
}

void ThreadPool::start_and_join() {
  const int64_t start = stats_.on ? now_ns() : 0;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_chunk(0);
  const int64_t own_done = stats_.on ? now_ns() : 0;
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) wait_step(spin);
  if (stats_.on) {
    const int64_t end = now_ns();
    ++stats_.loops;
    stats_.in_loops_ns += static_cast<uint64_t>(end - start);
    stats_.waited_ns += static_cast<uint64_t>(end - own_done);
    SiteStats& site = site_stats_[job_->target_type().name()];
    ++site.loops;
    site.in_loops_ns += static_cast<uint64_t>(end - start);
    site.waited_ns += static_cast<uint64_t>(end - own_done);
    if (stats_.last_end_ns >= 0 && start - stats_.last_end_ns < 1'000'000) {
      stats_.serial_ns += static_cast<uint64_t>(start - stats_.last_end_ns);
    }
    stats_.last_end_ns = end;
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little first: decode issues parallel loops back to back.
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kPauseSpins + 20000; ++spin) {
      wait_step(spin);
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_) return;
    run_chunk(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace kestrel
