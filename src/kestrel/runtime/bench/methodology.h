// The model card's benchmark methodology (docs/benchmarks.md#kestrel-bench): the two suites,
// their warm-ups and request counts, and the three per-request formulas, written against an
// abstract generator and clock so that tests can drive it with a fake model and a fake clock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kestrel::runtime::bench {

using TokenId = int32_t;

/// One suite of the card: `warmup` requests, then `requests` measured ones, each a fresh
/// sequence of `prompt_tokens` tokens followed by exactly `output_tokens` greedy tokens with
/// end of sequence ignored.
struct SuiteSpec {
  std::string name;            // "throughput" or "decode"
  size_t prompt_tokens = 0;    // N, the exact prompt length in tokens (BOS included)
  size_t output_tokens = 0;    // tokens generated per request, exactly
  size_t warmup = 0;           // warm-up requests, run first and excluded from every figure
  size_t requests = 0;         // measured requests, averaged
  bool same_prompt = false;    // true: every request uses prompt 0; false: request i uses prompt i
  /// Distinct prompts the suite needs: 1 when same_prompt, else warmup + requests.
  size_t prompts_needed() const { return same_prompt ? 1 : warmup + requests; }
};

/// Throughput: 2,048 tokens in, 128 out, a different text for every request, 3 warm-ups then 20.
SuiteSpec throughput_suite();
/// Decode: 3,072 tokens in, exactly 50 out, the same text every time, 2 warm-ups then 10.
SuiteSpec decode_suite();

/// A monotonic clock in seconds.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double now_s() = 0;
};

/// std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  double now_s() override;
};

/// What the runner asks of a generator for every request.
struct GenerationRequest {
  std::span<const TokenId> prompt;
  size_t output_tokens = 0;  // generate exactly this many
  bool ignore_eos = true;    // keep going past end-of-sequence tokens (always true here)
  bool greedy = true;        // temperature 0, argmax (always true here)
};

/// A model under test. generate() must start from an empty KV cache (no cached context), run
/// the prompt, and call on_token right after each generated token is chosen (the runner reads
/// its clock there). Returns the generated ids.
class Generator {
 public:
  virtual ~Generator() = default;
  virtual std::vector<TokenId> generate(const GenerationRequest& request,
                                        const std::function<void(TokenId)>& on_token) = 0;
  /// Speculative decoding in the last generate(): tokens drafted and verified, and those kept.
  struct Drafts {
    size_t drafted = 0, accepted = 0;
  };
  virtual Drafts last_drafts() const { return {}; }
};

/// A cumulative energy counter (joules since an arbitrary origin); nullopt when no sensor is
/// readable. Differences between two readings give the energy spent in between.
class EnergyMeter {
 public:
  virtual ~EnergyMeter() = default;
  virtual std::optional<double> energy_j() = 0;
};

/// The figures of one request. Times in seconds.
struct RequestResult {
  size_t index = 0;          // 0-based position in the suite, warm-ups first
  bool warmup = false;
  size_t prompt_index = 0;   // which prompt of the suite's set it ran
  size_t prompt_tokens = 0;
  size_t output_tokens = 0;
  double ttft_s = 0;         // request start to the first generated token (time to first token)
  double e2e_s = 0;          // request start to the end of the request (end-to-end latency)
  double decode_s = 0;       // the time after the first token: e2e_s - ttft_s
  double prefill_tok_s = 0;  // prompt_tokens / ttft_s
  double decode_tok_s = 0;   // (output_tokens - 1) / decode_s; 0 when output_tokens < 2
  double itl_max_s = 0;      // the longest gap between two consecutive generated tokens
  std::optional<double> energy_j;  // energy over the request when a sensor is readable
  size_t drafted_tokens = 0;   // speculative decoding: tokens drafted and verified
  size_t accepted_tokens = 0;  // drafted tokens that were the model's own (kept)
};

/// Mean, median, minimum, maximum and sample standard deviation of a figure.
struct Stat {
  double mean = 0, median = 0, min = 0, max = 0, stdev = 0;
};
/// Throws kestrel::Error for an empty set.
Stat stat_of(std::span<const double> values);

/// A suite's requests and its averages over the measured (non-warm-up) requests.
struct SuiteResult {
  SuiteSpec spec;
  std::vector<RequestResult> requests;  // warm-ups first, all of them
  Stat e2e_s, ttft_s, prefill_tok_s, decode_tok_s;  // over measured requests only
  size_t generated_tokens = 0;  // over measured requests
  size_t drafted_tokens = 0, accepted_tokens = 0;  // over measured requests (speculative decoding)
  double wall_s = 0;            // first measured request start to last measured request end
  std::optional<double> energy_j;            // over the same span, when readable
  std::optional<double> energy_per_token_j;  // energy_j / generated_tokens
  std::optional<double> avg_power_w;         // energy_j / wall_s
};

/// Progress: (suite, request index, total requests, whether it is a warm-up).
using ProgressFn = std::function<void(const SuiteSpec&, size_t, size_t, bool)>;

/// Runs `spec` on `generator`. `prompts` must hold spec.prompts_needed() prompts of exactly
/// spec.prompt_tokens tokens each (kestrel::Error otherwise). Request i uses prompt i (or
/// prompt 0 when spec.same_prompt). Throws kestrel::Error when the generator does not produce
/// exactly spec.output_tokens tokens or does not report each of them through on_token.
/// `meter` may be null (no energy figures).
SuiteResult run_suite(const SuiteSpec& spec, std::span<const std::vector<TokenId>> prompts,
                      Generator& generator, Clock& clock, EnergyMeter* meter = nullptr,
                      const ProgressFn& progress = nullptr);

}  // namespace kestrel::runtime::bench
