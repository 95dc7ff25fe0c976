#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "kestrel/base/thread_pool.h"

TEST(ThreadPool, CoversEveryIndexOnceWithGrainAlignedChunks) {
  for (int threads : {1, 2, 3, 5}) {
    kestrel::ThreadPool pool(threads);
    for (size_t n : {1u, 7u, 16u, 1000u, 1001u}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, 16, [&](size_t b, size_t e) {
        EXPECT_EQ(b % 16, 0u);
        for (size_t i = b; i < e; ++i) hits[i]++;
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPool, ManyBackToBackLoops) {
  kestrel::ThreadPool pool(2);
  std::atomic<long> sum{0};
  for (int r = 0; r < 2000; ++r) {
    pool.parallel_for(10, 1, [&](size_t b, size_t e) { sum += static_cast<long>(e - b); });
  }
  EXPECT_EQ(sum.load(), 20000);
}

TEST(ThreadPool, DynamicCoversEveryIndexOnceInChunksOfTheGrain) {
  // Every index once, each call a whole chunk [k * grain, min(n, (k + 1) * grain)), and a slow
  // chunk on one thread does not hold the others' work back to a fixed share: they take it.
  for (int threads : {1, 2, 3, 5}) {
    kestrel::ThreadPool pool(threads);
    for (size_t n : {1u, 7u, 16u, 1000u, 1001u}) {
      for (size_t grain : {1u, 16u, 5000u}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for_dynamic(n, grain, [&](size_t b, size_t e) {
          EXPECT_EQ(b % grain, 0u);
          EXPECT_EQ(e, std::min(n, b + grain));
          for (size_t i = b; i < e; ++i) hits[i]++;
        });
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain << " i=" << i;
      }
    }
  }
  kestrel::ThreadPool pool(2);
  std::vector<std::thread::id> ran_on(64);
  pool.parallel_for_dynamic(64, 1, [&](size_t b, size_t) {
    ran_on[b] = std::this_thread::get_id();
    if (b == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the first claim is slow
  });
  // Static halves would leave 32 chunks to the thread without chunk 0; the free one takes nearly all.
  const auto others = std::count_if(ran_on.begin(), ran_on.end(), [&](std::thread::id t) { return t != ran_on[0]; });
  EXPECT_GT(others, 32);
}

namespace {
// A loop body with a name of its own, for the per-loop statistics below.
void uneven_halves(kestrel::ThreadPool& pool) {
  pool.parallel_for(2, 1, [](size_t b, size_t) {
    if (b == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the worker's half is slow
  });
}
}  // namespace

TEST(ThreadPool, StatsNameEachLoopBodyAndItsWait) {
  setenv("KESTREL_POOL_STATS", "1", 1);
  testing::internal::CaptureStderr();
  {
    kestrel::ThreadPool pool(2);
    uneven_halves(pool);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  unsetenv("KESTREL_POOL_STATS");
  EXPECT_NE(err.find("thread pool (2 threads): 1 parallel loops"), std::string::npos) << err;
  // The line of the one body: the caller (index 0, fast) waited for the worker's 100 ms (a
  // bound with room for a caller descheduled on a loaded host).
  const size_t line = err.find("uneven_halves {lambda #1}");
  ASSERT_NE(line, std::string::npos) << err;
  const size_t start = err.rfind('\n', line) + 1;
  const double waited_ms = std::stod(err.substr(start, err.find(" ms waited", start) - start));
  EXPECT_GE(waited_ms, 50.0) << err;
}
