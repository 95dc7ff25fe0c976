#include <gtest/gtest.h>

#include <atomic>
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
