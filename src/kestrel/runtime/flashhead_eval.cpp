#include "kestrel/runtime/flashhead_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <unordered_map>

#include "kestrel/base/error.h"
#include "kestrel/head/flashhead.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/runtime/perplexity.h"

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

std::vector<double> softmax(std::span<const float> logits) {
  if (logits.empty()) throw Error("softmax of no logits");
  const double top = *std::max_element(logits.begin(), logits.end());
  if (!std::isfinite(top)) throw Error("softmax needs a finite largest logit");
  std::vector<double> p = log_softmax(logits);  // runtime/perplexity.h's, the harness's own
  for (double& x : p) x = std::exp(x);
  return p;
}

std::vector<TokenId> top_p_nucleus(std::span<const double> probs, double p) {
  if (probs.empty()) throw Error("top-p nucleus of an empty distribution");
  if (!(p > 0.0 && p <= 1.0)) throw Error("top-p must lie in (0, 1], not " + std::to_string(p));
  // Descending probability, ties to the lower id: a strict total order, so the ranking is unique.
  const auto before = [&](TokenId a, TokenId b) {
    const double pa = probs[static_cast<size_t>(a)], pb = probs[static_cast<size_t>(b)];
    return pa > pb || (pa == pb && a < b);
  };
  // The tokens of probability >= t are a head of the ranking, usually short: take the first t
  // (falling 16x a round, to 0: every token) whose head's mass reaches p, and rank that head only.
  std::vector<TokenId> head;
  for (double t = 1.0 / 1024;; t = t > 1e-30 ? t / 16 : 0.0) {
    head.clear();
    double mass = 0;
    for (size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] >= t) {
        head.push_back(static_cast<TokenId>(i));
        mass += probs[i];
      }
    }
    if (mass < p && t > 0) continue;
    std::sort(head.begin(), head.end(), before);
    double cumulative = 0;  // summed in ranking order (mass, in id order, may differ in the last bits)
    for (size_t i = 0; i < head.size(); ++i) {
      cumulative += probs[static_cast<size_t>(head[i])];
      if (cumulative >= p) {
        head.resize(i + 1);
        return head;
      }
    }
    if (t == 0) return head;
  }
}

NucleusCover nucleus_cover(std::span<const double> probs, std::span<const TokenId> nucleus,
                           std::span<const TokenId> candidates) {
  std::vector<uint8_t> candidate(probs.size(), 0);
  for (TokenId t : candidates) candidate.at(static_cast<size_t>(t)) = 1;
  NucleusCover c;
  c.covered = std::all_of(nucleus.begin(), nucleus.end(),
                          [&](TokenId t) { return candidate.at(static_cast<size_t>(t)) != 0; });
  for (size_t i = 0; i < probs.size(); ++i) {
    if (candidate[i] == 0) c.missed_mass += probs[i];
  }
  c.missed_mass = std::min(c.missed_mass, 1.0);
  return c;
}

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
  if (!(options.top_p_cover >= 0.0 && options.top_p_cover <= 1.0)) {
    throw Error("flashhead-eval: --top-p-cover must lie in [0, 1]");
  }
  const bool measure_cover = options.top_p_cover > 0.0;
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
      dense_fallback(probes.size(), 0), unproven(probes.size(), 0), covered(probes.size(), 0),
      missed_sum(probes.size(), 0), missed_max(probes.size(), 0), sampler_covered(probes.size(), 0);
  double nucleus_sum = 0;
  size_t nucleus_max = 0;
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
      std::vector<TokenId> sampler_support;  // the tokens the dense sampler can draw
      if (compare_sampling) {
        std::vector<float> copy(dense.begin(), dense.end());
        Sampler s(options.sampler);
        dense_dist = s.distribution(TokenScores{copy, {}}, history);
        for (const auto& [t, pr] : dense_dist) {
          if (pr > 0) sampler_support.push_back(t);
        }
      }
      std::vector<double> dense_probs;
      std::vector<TokenId> nucleus;
      if (measure_cover) {
        dense_probs = softmax(dense);
        nucleus = top_p_nucleus(dense_probs, options.top_p_cover);
        nucleus_sum += static_cast<double>(nucleus.size());
        nucleus_max = std::max(nucleus_max, nucleus.size());
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
        if (measure_cover) {
          const NucleusCover cover = nucleus_cover(dense_probs, nucleus, cand.ids);
          covered[pi] += cover.covered;
          missed_sum[pi] += cover.missed_mass;
          missed_max[pi] = std::max(missed_max[pi], cover.missed_mass);
        }
        if (compare_sampling) {
          Sampler s(options.sampler);
          const double tv = total_variation(dense_dist, s.distribution(TokenScores{cand.logits, cand.ids}, history));
          tv_sum[pi] += tv;
          tv_max[pi] = std::max(tv_max[pi], tv);
          if (measure_cover) sampler_covered[pi] += nucleus_cover(dense_probs, sampler_support, cand.ids).covered;
        }
      }
    }
    if (progress) progress(done, positions);
  }
  FlashHeadEvalResult r;
  r.positions = done;
  r.dense_head_ms = median(dense_ms);
  const double n = static_cast<double>(std::max<size_t>(done, 1));
  r.top_p = options.top_p_cover;
  r.mean_nucleus = nucleus_sum / n;
  r.max_nucleus = nucleus_max;
  for (size_t pi = 0; pi < probes.size(); ++pi) {
    ProbeResult row;
    row.probes = probes[pi];
    row.candidates = n_cand[pi] / n;
    row.same_top1_pct = 100.0 * same[pi] / n;
    row.recall_pct = 100.0 * recall[pi] / n;
    row.head_ms = median(flash_ms[pi]);
    row.mean_tv = tv_sum[pi] / n;
    row.max_tv = tv_max[pi];
    row.top_p_cover_pct = 100.0 * covered[pi] / n;
    row.missed_mass = missed_sum[pi] / n;
    row.max_missed_mass = missed_max[pi];
    row.sampler_cover_pct = 100.0 * sampler_covered[pi] / n;
    row.mean_probes = clusters[pi] / n;
    row.extra_probes_pct = 100.0 * extra[pi] / n;
    row.dense_pct = 100.0 * dense_fallback[pi] / n;
    row.unproven_pct = 100.0 * unproven[pi] / n;
    r.rows.push_back(row);
  }
  return r;
}

}  // namespace kestrel::runtime
