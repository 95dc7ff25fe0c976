// `kestrel bench --concurrency`'s figures from a round's clock (runtime/bench/concurrency.h), on
// hand-made token times: no model, no scheduler.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "kestrel/runtime/bench/concurrency.h"

namespace kestrel::runtime::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Stream times in milliseconds after t0.
std::vector<Clock::time_point> at_ms(Clock::time_point t0, const std::vector<int>& ms) {
  std::vector<Clock::time_point> v;
  for (int m : ms) v.push_back(t0 + std::chrono::milliseconds(m));
  return v;
}

TEST(BenchConcurrency, SteadyWindowLeavesOutTheTailWhereStreamsHaveFinished) {
  const Clock::time_point t0{};
  // Stream 0 starts first (its first token at 100 ms) and finishes first (at 400 ms); stream 1's
  // first token comes at 200 ms, its last at 700 ms. Both decode together in (200, 400].
  const std::vector<std::vector<Clock::time_point>> stamps = {
      at_ms(t0, {100, 150, 250, 300, 350, 400}),
      at_ms(t0, {200, 300, 400, 500, 600, 700}),
  };
  const ConcurrencyRound r = summarize_round(stamps, t0);
  EXPECT_EQ(r.concurrency, 2u);
  EXPECT_EQ(r.generated_tokens, 12u);
  EXPECT_NEAR(r.wall_s, 0.7, 1e-12);
  ASSERT_EQ(r.ttft_s.size(), 2u);
  EXPECT_NEAR(r.ttft_s[0], 0.1, 1e-12);
  EXPECT_NEAR(r.ttft_s[1], 0.2, 1e-12);
  // After 200 ms: 4 tokens of stream 0 (250..400) and 5 of stream 1 (300..700) over 0.5 s.
  EXPECT_NEAR(r.aggregate_decode_tok_s, 9 / 0.5, 1e-9);
  // In (200, 400]: 4 of stream 0 and 2 of stream 1 (300, 400) over 0.2 s: 30 tok/s, against the
  // aggregate's 18, which the tail of stream 1 alone (500..700) pulls down.
  EXPECT_NEAR(r.steady_decode_tok_s, 6 / 0.2, 1e-9);
  ASSERT_EQ(r.itl_s.size(), 10u);
  EXPECT_NEAR(r.itl_p99_s[1], 0.1, 1e-12);
}

TEST(BenchConcurrency, OneStreamIsSteadyThroughout) {
  const Clock::time_point t0{};
  const ConcurrencyRound r = summarize_round({at_ms(t0, {50, 60, 70, 80, 90})}, t0);
  // After the first token: 4 tokens in 40 ms, the same either way.
  EXPECT_NEAR(r.aggregate_decode_tok_s, 100.0, 1e-9);
  EXPECT_NEAR(r.steady_decode_tok_s, 100.0, 1e-9);
}

TEST(BenchConcurrency, NoWindowGivesZeroNotADivisionByZero) {
  const Clock::time_point t0{};
  // Stream 1 gets its first token only after stream 0 has finished: no time with both decoding.
  const ConcurrencyRound r = summarize_round({at_ms(t0, {10, 20}), at_ms(t0, {30, 40}), {}}, t0);
  EXPECT_EQ(r.steady_decode_tok_s, 0.0);
  EXPECT_NEAR(r.aggregate_decode_tok_s, 1 / 0.01, 1e-9);  // 40 ms after 30 ms
  EXPECT_EQ(r.ttft_s.size(), 2u);  // the empty stream is left out
  EXPECT_EQ(summarize_round({}, t0).steady_decode_tok_s, 0.0);
}

}  // namespace
}  // namespace kestrel::runtime::bench
