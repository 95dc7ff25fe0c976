#include "kestrel/runtime/speculative_sampling.h"

#include <algorithm>
#include <unordered_map>

#include "kestrel/base/error.h"

namespace kestrel::runtime {
namespace {

double uniform(std::mt19937_64& rng) { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); }

// A draw from the (unnormalised, non-negative) `weights` of `tokens`; the last token with
// positive weight when rounding leaves the running sum short of the target.
TokenId draw_weighted(const std::vector<std::pair<TokenId, double>>& weights, double total, std::mt19937_64& rng) {
  const double target = uniform(rng) * total;
  double cumulative = 0.0;
  TokenId last = weights.front().first;
  for (const auto& [token, w] : weights) {
    if (w <= 0.0) continue;
    cumulative += w;
    last = token;
    if (target < cumulative) return token;
  }
  return last;
}

}  // namespace

double probability_of(const TokenDistribution& d, TokenId token) {
  for (const auto& [t, p] : d) {
    if (t == token) return p;
  }
  return 0.0;
}

TokenId draw_token(const TokenDistribution& d, std::mt19937_64& rng) {
  if (d.empty()) throw Error("draw_token: an empty distribution");
  double total = 0.0;
  for (const auto& [t, p] : d) total += std::max(0.0, p);
  return draw_weighted(d, total, rng);
}

SpeculativeOutcome speculative_accept(const TokenDistribution& p, const TokenDistribution& q, TokenId draft,
                                      std::mt19937_64& rng) {
  if (p.empty()) throw Error("speculative_accept: the target distribution is empty");
  const double q_draft = probability_of(q, draft);
  if (!(q_draft > 0.0)) {
    throw Error("speculative_accept: token " + std::to_string(draft) +
                " has probability 0 under the distribution it was drafted from");
  }
  const double p_draft = probability_of(p, draft);
  if (uniform(rng) * q_draft < p_draft) return {draft, true};
  // Rejected: the residual max(0, p - q), over p's support (elsewhere p = 0).
  std::unordered_map<TokenId, double> q_of;
  q_of.reserve(q.size());
  for (const auto& [t, v] : q) q_of[t] = v;
  std::vector<std::pair<TokenId, double>> residual;
  residual.reserve(p.size());
  double total = 0.0;
  for (const auto& [t, v] : p) {
    const auto it = q_of.find(t);
    const double r = std::max(0.0, v - (it == q_of.end() ? 0.0 : it->second));
    residual.emplace_back(t, r);
    total += r;
  }
  if (!(total > 0.0)) return {draw_token(p, rng), false};
  return {draw_weighted(residual, total, rng), false};
}

}  // namespace kestrel::runtime
