#include "kestrel/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

namespace kestrel::runtime {

TokenId argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<TokenId>(best);
}

Sampler::Sampler(const SamplerConfig& config) : config_(config), rng_(config.seed) {}

void Sampler::apply_presence_frequency(std::span<float> logits, std::span<const TokenId> history) const {
  const size_t n = config_.repeat_last_n < 0
                       ? history.size()
                       : std::min(history.size(), static_cast<size_t>(config_.repeat_last_n));
  std::unordered_map<TokenId, int> counts;
  for (size_t i = history.size() - n; i < history.size(); ++i) ++counts[history[i]];
  for (const auto& [t, count] : counts) {
    if (t < 0 || static_cast<size_t>(t) >= logits.size()) continue;
    logits[static_cast<size_t>(t)] -= static_cast<float>(count) * config_.frequency_penalty + config_.presence_penalty;
  }
}

TokenId Sampler::sample(std::span<float> logits, std::span<const TokenId> history) {
  if (config_.repeat_penalty != 1.0f && config_.repeat_last_n != 0) {
    const size_t n = config_.repeat_last_n < 0
                         ? history.size()
                         : std::min(history.size(), static_cast<size_t>(config_.repeat_last_n));
    std::unordered_set<TokenId> seen(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    for (TokenId t : seen) {
      if (t < 0 || static_cast<size_t>(t) >= logits.size()) continue;
      float& l = logits[static_cast<size_t>(t)];
      l = l > 0.0f ? l / config_.repeat_penalty : l * config_.repeat_penalty;
    }
  }
  if ((config_.presence_penalty != 0.0f || config_.frequency_penalty != 0.0f) && config_.repeat_last_n != 0) {
    apply_presence_frequency(logits, history);
  }
  if (config_.temperature <= 0.0f) return argmax(logits);

  // Candidates sorted by logit (descending; ties to the lower id), cut by top-k.
  candidates_.clear();
  candidates_.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    candidates_.emplace_back(logits[i], static_cast<TokenId>(i));
  }
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t k = candidates_.size();
  if (config_.top_k > 0) k = std::min(k, static_cast<size_t>(config_.top_k));
  std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(k),
                    candidates_.end(), by_logit);
  candidates_.resize(k);

  // Softmax at temperature 1 for the top-p and min-p cuts (as llama.cpp's chain does).
  std::vector<double> p(k);
  double sum = 0.0;
  for (size_t i = 0; i < k; ++i) sum += p[i] = std::exp(static_cast<double>(candidates_[i].first - candidates_[0].first));
  for (auto& v : p) v /= sum;
  size_t keep = k;
  if (config_.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < k; ++i) {
      cumulative += p[i];
      if (cumulative >= config_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (config_.min_p > 0.0f) {
    const double threshold = config_.min_p * p[0];
    size_t i = 1;
    while (i < keep && p[i] >= threshold) ++i;
    keep = i;
  }
  candidates_.resize(keep);

  std::vector<double> weights(keep);
  for (size_t i = 0; i < keep; ++i) {
    weights[i] = std::exp(static_cast<double>(candidates_[i].first - candidates_[0].first) /
                          static_cast<double>(config_.temperature));
  }
  std::discrete_distribution<size_t> dist(weights.begin(), weights.end());
  return candidates_[dist(rng_)].second;
}

}  // namespace kestrel::runtime
