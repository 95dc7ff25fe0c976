#include "kestrel/runtime/bench/methodology.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kestrel/base/error.h"

namespace kestrel::runtime::bench {

SuiteSpec throughput_suite() {
  return {.name = "throughput", .prompt_tokens = 2048, .output_tokens = 128, .warmup = 3,
          .requests = 20, .same_prompt = false};
}

SuiteSpec decode_suite() {
  return {.name = "decode", .prompt_tokens = 3072, .output_tokens = 50, .warmup = 2,
          .requests = 10, .same_prompt = true};
}

double SteadyClock::now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Stat stat_of(std::span<const double> values) {
  if (values.empty()) throw Error("no values to average");
  std::vector<double> v(values.begin(), values.end());
  std::sort(v.begin(), v.end());
  Stat s;
  const size_t n = v.size();
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(n);
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.max = v.back();
  if (n > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.stdev = std::sqrt(ss / static_cast<double>(n - 1));
  }
  return s;
}

SuiteResult run_suite(const SuiteSpec& spec, std::span<const std::vector<TokenId>> prompts,
                      Generator& generator, Clock& clock, EnergyMeter* meter,
                      const ProgressFn& progress) {
  if (spec.requests == 0) throw Error("suite " + spec.name + ": at least one measured request is needed");
  if (spec.prompt_tokens == 0) throw Error("suite " + spec.name + ": the prompt length must be positive");
  if (spec.output_tokens == 0) throw Error("suite " + spec.name + ": the output length must be positive");
  if (prompts.size() < spec.prompts_needed()) {
    throw Error("suite " + spec.name + " needs " + std::to_string(spec.prompts_needed()) +
                " prompts, got " + std::to_string(prompts.size()));
  }
  for (size_t i = 0; i < spec.prompts_needed(); ++i) {
    if (prompts[i].size() != spec.prompt_tokens) {
      throw Error("suite " + spec.name + ": prompt " + std::to_string(i) + " has " +
                  std::to_string(prompts[i].size()) + " tokens, not " + std::to_string(spec.prompt_tokens));
    }
  }

  SuiteResult result;
  result.spec = spec;
  const size_t total = spec.warmup + spec.requests;
  std::vector<double> stamps;
  stamps.reserve(spec.output_tokens);
  double measured_start = 0, measured_end = 0;
  std::optional<double> measured_e0;
  std::optional<double> measured_e1;

  for (size_t i = 0; i < total; ++i) {
    const bool warmup = i < spec.warmup;
    if (progress) progress(spec, i, total, warmup);
    RequestResult r;
    r.index = i;
    r.warmup = warmup;
    r.prompt_index = spec.same_prompt ? 0 : i;
    const std::vector<TokenId>& prompt = prompts[r.prompt_index];
    r.prompt_tokens = prompt.size();

    GenerationRequest request;
    request.prompt = prompt;
    request.output_tokens = spec.output_tokens;
    request.ignore_eos = true;
    request.greedy = true;
    stamps.clear();
    const std::optional<double> e0 = meter ? meter->energy_j() : std::nullopt;
    const double t0 = clock.now_s();
    const std::vector<TokenId> out =
        generator.generate(request, [&](TokenId) { stamps.push_back(clock.now_s()); });
    const double t_end = clock.now_s();
    const std::optional<double> e1 = meter ? meter->energy_j() : std::nullopt;

    if (out.size() != spec.output_tokens || stamps.size() != spec.output_tokens) {
      throw Error("suite " + spec.name + ", request " + std::to_string(i) + ": the generator produced " +
                  std::to_string(out.size()) + " tokens (" + std::to_string(stamps.size()) +
                  " reported), not exactly " + std::to_string(spec.output_tokens));
    }
    r.output_tokens = out.size();
    r.ttft_s = stamps.front() - t0;
    r.e2e_s = t_end - t0;
    r.decode_s = r.e2e_s - r.ttft_s;
    r.prefill_tok_s = r.ttft_s > 0 ? static_cast<double>(r.prompt_tokens) / r.ttft_s : 0;
    r.decode_tok_s = r.output_tokens > 1 && r.decode_s > 0
                         ? static_cast<double>(r.output_tokens - 1) / r.decode_s : 0;
    for (size_t k = 1; k < stamps.size(); ++k) r.itl_max_s = std::max(r.itl_max_s, stamps[k] - stamps[k - 1]);
    if (e0 && e1) r.energy_j = *e1 - *e0;
    const Generator::Drafts drafts = generator.last_drafts();
    r.drafted_tokens = drafts.drafted;
    r.accepted_tokens = drafts.accepted;

    if (i == spec.warmup) {
      measured_start = t0;
      measured_e0 = e0;
    }
    if (i + 1 == total) {
      measured_end = t_end;
      measured_e1 = e1;
    }
    result.requests.push_back(r);
  }

  std::vector<double> e2e, ttft, prefill, decode;
  for (const RequestResult& r : result.requests) {
    if (r.warmup) continue;
    e2e.push_back(r.e2e_s);
    ttft.push_back(r.ttft_s);
    prefill.push_back(r.prefill_tok_s);
    decode.push_back(r.decode_tok_s);
    result.generated_tokens += r.output_tokens;
    result.drafted_tokens += r.drafted_tokens;
    result.accepted_tokens += r.accepted_tokens;
  }
  result.e2e_s = stat_of(e2e);
  result.ttft_s = stat_of(ttft);
  result.prefill_tok_s = stat_of(prefill);
  result.decode_tok_s = stat_of(decode);
  result.wall_s = measured_end - measured_start;
  if (measured_e0 && measured_e1) {
    result.energy_j = *measured_e1 - *measured_e0;
    result.energy_per_token_j = *result.energy_j / static_cast<double>(result.generated_tokens);
    if (result.wall_s > 0) result.avg_power_w = *result.energy_j / result.wall_s;
  }
  return result;
}

}  // namespace kestrel::runtime::bench
