// A ticket lock: threads get the engine in the order they asked for it (std::mutex is not fair).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace kestrel::server {

class FifoLock {
 public:
  /// Blocks until every earlier caller has called unlock().
  void lock() {
    std::unique_lock guard(mu_);
    const uint64_t ticket = next_++;
    cv_.wait(guard, [&] { return serving_ == ticket; });
  }
  void unlock() {
    {
      std::lock_guard guard(mu_);
      ++serving_;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0;
  uint64_t serving_ = 0;
};

}  // namespace kestrel::server
