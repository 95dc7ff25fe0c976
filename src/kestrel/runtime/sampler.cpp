#include "kestrel/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace kestrel::runtime {

TokenId argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<TokenId>(best);
}

TokenId argmax(const TokenScores& scores) {
  if (scores.ids.empty()) return argmax(std::span<const float>(scores.logits));
  size_t best = 0;
  for (size_t i = 1; i < scores.size(); ++i) {
    if (scores.logits[i] > scores.logits[best] ||
        (scores.logits[i] == scores.logits[best] && scores.ids[i] < scores.ids[best])) {
      best = i;
    }
  }
  return scores.ids[best];
}

Sampler::Sampler(const SamplerConfig& config) : config_(config), rng_(config.seed) {}

void Sampler::filter(TokenScores scores, std::span<const TokenId> history, std::vector<double>& weights) {
  const bool repeat = config_.repeat_penalty != 1.0f;
  const bool openai = config_.presence_penalty != 0.0f || config_.frequency_penalty != 0.0f;
  if ((repeat || openai) && config_.repeat_last_n != 0) {
    const size_t n = config_.repeat_last_n < 0
                         ? history.size()
                         : std::min(history.size(), static_cast<size_t>(config_.repeat_last_n));
    std::unordered_map<TokenId, int> counts;
    for (size_t i = history.size() - n; i < history.size(); ++i) ++counts[history[i]];
    auto penalize = [&](float& l, int count) {
      if (repeat) l = l > 0.0f ? l / config_.repeat_penalty : l * config_.repeat_penalty;
      if (openai) l -= static_cast<float>(count) * config_.frequency_penalty + config_.presence_penalty;
    };
    if (scores.ids.empty()) {
      for (const auto& [t, count] : counts) {
        if (t >= 0 && static_cast<size_t>(t) < scores.size()) penalize(scores.logits[static_cast<size_t>(t)], count);
      }
    } else {
      for (size_t i = 0; i < scores.size(); ++i) {
        if (const auto it = counts.find(scores.ids[i]); it != counts.end()) penalize(scores.logits[i], it->second);
      }
    }
  }
  candidates_.clear();
  weights.clear();
  if (config_.temperature <= 0.0f) {
    candidates_.emplace_back(0.0f, argmax(scores));
    weights.push_back(1.0);
    return;
  }

  // Candidates sorted by logit (descending; ties to the lower id), cut by top-k.
  candidates_.reserve(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) candidates_.emplace_back(scores.logits[i], scores.id(i));
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
  weights.resize(keep);
  for (size_t i = 0; i < keep; ++i) {
    weights[i] = std::exp(static_cast<double>(candidates_[i].first - candidates_[0].first) /
                          static_cast<double>(config_.temperature));
  }
}

TokenId Sampler::sample(TokenScores scores, std::span<const TokenId> history) {
  std::vector<double> weights;
  filter(scores, history, weights);
  if (config_.temperature <= 0.0f) return candidates_[0].second;
  std::discrete_distribution<size_t> dist(weights.begin(), weights.end());
  return candidates_[dist(rng_)].second;
}

std::vector<std::pair<TokenId, double>> Sampler::distribution(TokenScores scores,
                                                              std::span<const TokenId> history) {
  std::vector<double> weights;
  filter(scores, history, weights);
  double sum = 0.0;
  for (double w : weights) sum += w;
  std::vector<std::pair<TokenId, double>> out;
  for (size_t i = 0; i < weights.size(); ++i) out.emplace_back(candidates_[i].second, weights[i] / sum);
  return out;
}

}  // namespace kestrel::runtime
