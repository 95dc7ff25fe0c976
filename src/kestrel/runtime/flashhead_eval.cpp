#include "kestrel/runtime/flashhead_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_map>

#include "kestrel/base/error.h"
#include "kestrel/head/flashhead.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

double total_variation(const std::vector<std::pair<TokenId, double>>& p,
                       const std::vector<std::pair<TokenId, double>>& q) {
  std::unordered_map<TokenId, double> diff;
  for (const auto& [t, pr] : p) diff[t] += pr;
  for (const auto& [t, pr] : q) diff[t] -= pr;
  double sum = 0;
  for (const auto& [t, d] : diff) sum += std::fabs(d);
  return 0.5 * sum;
}

FlashHeadEvalResult evaluate_flashhead(Engine& engine, std::span<const TokenId> tokens,
                                       const FlashHeadEvalOptions& options,
                                       const std::function<void(size_t, size_t)>& progress) {
  const head::FlashHead* flash = options.flashhead != nullptr ? options.flashhead : engine.flashhead();
  if (flash == nullptr) throw Error("flashhead-eval needs an image built with --flashhead (and not --head dense)");
  if (tokens.size() < 2) throw Error("flashhead-eval needs at least 2 tokens of text");
  if (options.n_ctx < 2) throw Error("flashhead-eval: --ctx must be at least 2");
  std::vector<size_t> probes = options.probes;
  if (probes.empty()) probes.push_back(flash->default_probes());
  for (size_t p : probes) {
    if (p == 0 || p > flash->n_clusters()) {
      throw Error("probe count " + std::to_string(p) + " is outside 1.." + std::to_string(flash->n_clusters()));
    }
  }
  const auto& model = engine.model();
  const auto& head = model.output_head();
  const size_t d = model.info().d_model, v = model.info().n_vocab;
  const bool compare_sampling = options.sampler.temperature > 0.0f;

  const size_t positions = std::min(options.max_positions, tokens.size() - 1);
  const size_t n_chunks = (positions + options.n_ctx - 2) / (options.n_ctx - 1);
  model::KvCache cache = model.new_cache(std::min(options.n_ctx, model.info().context_length));
  // Positions the dense head scores per call (FlashHeadEvalOptions::time_dense_head).
  const size_t dense_rows = options.time_dense_head ? 1 : kernels::kTileMinTokens - 1;
  std::vector<float> hidden, dense_block(dense_rows * v);
  head::Candidates cand;
  std::vector<double> dense_ms;
  std::vector<std::vector<double>> flash_ms(probes.size());
  std::vector<double> same(probes.size(), 0), recall(probes.size(), 0), n_cand(probes.size(), 0),
      tv_sum(probes.size(), 0), tv_max(probes.size(), 0), clusters(probes.size(), 0), extra(probes.size(), 0),
      dense_fallback(probes.size(), 0), unproven(probes.size(), 0);
  size_t done = 0;
  for (size_t chunk = 0; chunk < n_chunks && done < positions; ++chunk) {
    // Chunk c covers tokens [c * (n_ctx - 1), ...): BOS-free continuation of the text, the
    // position at index i predicting token i + 1.
    const size_t begin = chunk * (cache.n_ctx - 1);
    const size_t n = std::min(cache.n_ctx, tokens.size() - begin);
    if (n < 2) break;
    cache.clear();
    hidden.resize(n * d);
    model.forward_hidden(tokens.subspan(begin, n), cache, model::Logits::kAll, hidden.data(), engine.pool());
    for (size_t i = 0; i + 1 < n && done < positions; ++i, ++done) {
      const float* h = &hidden[i * d];
      if (i % dense_rows == 0) {
        const size_t rows = std::min({dense_rows, n - 1 - i, positions - done});
        const auto t0 = Clock::now();
        head::dense_logits(head, h, rows, dense_block.data(), engine.pool());
        if (options.time_dense_head) dense_ms.push_back(ms_between(t0, Clock::now()));
      }
      const std::span<const float> dense(&dense_block[(i % dense_rows) * v], v);
      const TokenId best = argmax(dense);
      const auto history = tokens.subspan(0, begin + i + 1);
      std::vector<std::pair<TokenId, double>> dense_dist;
      if (compare_sampling) {
        std::vector<float> copy(dense.begin(), dense.end());
        Sampler s(options.sampler);
        dense_dist = s.distribution(TokenScores{copy, {}}, history);
      }
      for (size_t pi = 0; pi < probes.size(); ++pi) {
        const auto t1 = Clock::now();
        flash->search(h, probes[pi], cand, engine.pool());
        flash_ms[pi].push_back(ms_between(t1, Clock::now()));
        n_cand[pi] += static_cast<double>(cand.size());
        clusters[pi] += static_cast<double>(cand.clusters);
        extra[pi] += cand.proof == head::Proof::kExtra;
        dense_fallback[pi] += cand.proof == head::Proof::kDense;
        unproven[pi] += cand.proof == head::Proof::kNone;
        if (head::greedy(cand) == best) same[pi] += 1;
        if (std::find(cand.ids.begin(), cand.ids.end(), best) != cand.ids.end()) recall[pi] += 1;
        if (compare_sampling) {
          Sampler s(options.sampler);
          const double tv = total_variation(dense_dist, s.distribution(TokenScores{cand.logits, cand.ids}, history));
          tv_sum[pi] += tv;
          tv_max[pi] = std::max(tv_max[pi], tv);
        }
      }
    }
    if (progress) progress(done, positions);
  }
  FlashHeadEvalResult r;
  r.positions = done;
  r.dense_head_ms = median(dense_ms);
  const double n = static_cast<double>(std::max<size_t>(done, 1));
  for (size_t pi = 0; pi < probes.size(); ++pi) {
    ProbeResult row;
    row.probes = probes[pi];
    row.candidates = n_cand[pi] / n;
    row.same_top1_pct = 100.0 * same[pi] / n;
    row.recall_pct = 100.0 * recall[pi] / n;
    row.head_ms = median(flash_ms[pi]);
    row.mean_tv = tv_sum[pi] / n;
    row.max_tv = tv_max[pi];
    row.mean_probes = clusters[pi] / n;
    row.extra_probes_pct = 100.0 * extra[pi] / n;
    row.dense_pct = 100.0 * dense_fallback[pi] / n;
    row.unproven_pct = 100.0 * unproven[pi] / n;
    r.rows.push_back(row);
  }
  return r;
}

}  // namespace kestrel::runtime
