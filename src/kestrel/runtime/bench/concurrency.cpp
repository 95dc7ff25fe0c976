#include "kestrel/runtime/bench/concurrency.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <thread>

#include "kestrel/runtime/scheduler.h"

namespace kestrel::runtime::bench {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

ConcurrencyRound summarize_round(const std::vector<std::vector<std::chrono::steady_clock::time_point>>& stamps,
                                 std::chrono::steady_clock::time_point t0) {
  using Clock = std::chrono::steady_clock;
  auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  ConcurrencyRound r;
  r.concurrency = stamps.size();
  // all_started: the last stream's first token; first_end: the first stream to finish's last.
  Clock::time_point all_started = t0, end = t0, first_end = Clock::time_point::max();
  for (const auto& s : stamps) {
    if (s.empty()) continue;
    r.ttft_s.push_back(secs(t0, s.front()));
    all_started = std::max(all_started, s.front());
    end = std::max(end, s.back());
    first_end = std::min(first_end, s.back());
    std::vector<double> gaps;
    for (size_t k = 1; k < s.size(); ++k) gaps.push_back(secs(s[k - 1], s[k]));
    r.itl_s.insert(r.itl_s.end(), gaps.begin(), gaps.end());
    r.itl_p99_s.push_back(percentile(gaps, 99));
    r.generated_tokens += s.size();
  }
  r.wall_s = secs(t0, end);
  size_t after = 0, steady = 0;
  for (const auto& s : stamps) {
    for (const auto t : s) {
      after += t > all_started ? 1 : 0;
      steady += t > all_started && t <= first_end ? 1 : 0;
    }
  }
  const double window = secs(all_started, end);
  r.aggregate_decode_tok_s = window > 0 ? static_cast<double>(after) / window : 0;
  const double steady_window = first_end == Clock::time_point::max() ? 0 : secs(all_started, first_end);
  r.steady_decode_tok_s = steady_window > 0 ? static_cast<double>(steady) / steady_window : 0;
  return r;
}

ConcurrencyRound run_concurrency_round(Engine& engine, std::span<const std::vector<TokenId>> prompts,
                                       size_t output_tokens, size_t prefill_chunk) {
  using Clock = std::chrono::steady_clock;
  const size_t n = prompts.size();
  Scheduler scheduler(engine, {.n_sessions = n, .prefill_chunk = prefill_chunk});
  std::vector<std::vector<Clock::time_point>> stamps(n);
  for (auto& s : stamps) s.reserve(output_tokens);
  const auto t0 = Clock::now();
  std::vector<std::thread> clients;
  std::vector<std::exception_ptr> errors(n);
  for (size_t i = 0; i < n; ++i) {
    clients.emplace_back([&, i] {
      try {
      GenerateOptions o;
      o.max_tokens = output_tokens;
      o.sampler.temperature = 0;
      o.ignore_eos = true;
      // Stamped on the client's thread when the token reaches it, as a server's client sees it.
      o.on_token = [&stamps, i](TokenId, const StepLogprobs*) {
        stamps[i].push_back(Clock::now());
        return true;
      };
      scheduler.run(prompts[i], o);
      } catch (...) {
        errors[i] = std::current_exception();  // rethrown on the calling thread, not std::terminate
      }
    });
  }
  for (auto& c : clients) c.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  ConcurrencyRound r = summarize_round(stamps, t0);
  r.concurrency = n;
  return r;
}

}  // namespace kestrel::runtime::bench
