// kestrel bench --concurrency: N clients at once through the continuous-batching scheduler
// (runtime/scheduler.h), as a server would run them: aggregate decode throughput, per-user
// inter-token latency (ITL) and time to first token (TTFT).
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include "kestrel/runtime/engine.h"

namespace kestrel::runtime::bench {

/// One round: `prompts.size()` requests started together, greedy, `output_tokens` each (end of
/// sequence ignored), in a Scheduler of as many sessions.
struct ConcurrencyRound {
  size_t concurrency = 0;
  double wall_s = 0;                // first request submitted to the last token
  size_t generated_tokens = 0;      // all requests
  double aggregate_decode_tok_s = 0;  // tokens after every stream had its first / the time they took
  // The same while every stream is decoding: tokens after the last first token, up to and
  // including the first stream's last token, over that window (0 when it is empty). Without the
  // tail in which streams that started early have finished and fewer rows share a step.
  double steady_decode_tok_s = 0;
  std::vector<double> ttft_s;       // per request
  std::vector<double> itl_s;        // every gap between consecutive tokens of a request, all requests
  std::vector<double> itl_p99_s;    // per request: the 99th percentile of its gaps
};

/// The figures of a round from its clock: stamps[i] are the times stream i's tokens reached its
/// client (in order; an empty stream is left out), t0 the time the requests were submitted.
ConcurrencyRound summarize_round(const std::vector<std::vector<std::chrono::steady_clock::time_point>>& stamps,
                                 std::chrono::steady_clock::time_point t0);

/// Runs one round. Throws kestrel::Error as Scheduler::run does.
ConcurrencyRound run_concurrency_round(Engine& engine, std::span<const std::vector<TokenId>> prompts,
                                       size_t output_tokens, size_t prefill_chunk);

/// The p-th percentile (0..100) of `values` by linear interpolation between order statistics
/// (numpy's default); 0 for no values.
double percentile(std::vector<double> values, double p);

}  // namespace kestrel::runtime::bench
