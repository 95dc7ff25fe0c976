#include "kestrel/runtime/logprobs.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kestrel/base/error.h"

namespace kestrel::runtime {

StepLogprobs compute_logprobs(std::span<const float> logits, TokenId chosen, size_t n_top) {
  if (logits.empty()) throw Error("logprobs: empty logits");
  if (chosen < 0 || static_cast<size_t>(chosen) >= logits.size()) {
    throw Error("logprobs: token " + std::to_string(chosen) + " outside the vocabulary");
  }
  // Stable log-sum-exp: max first, then the sum of exp(l - max) in double.
  float max_logit = logits[0];
  for (float l : logits) max_logit = std::max(max_logit, l);
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - static_cast<double>(max_logit));
  const double log_z = static_cast<double>(max_logit) + std::log(sum);
  auto logprob_of = [&](size_t i) { return static_cast<float>(static_cast<double>(logits[i]) - log_z); };

  StepLogprobs out;
  out.chosen = {chosen, logprob_of(static_cast<size_t>(chosen))};
  n_top = std::min(n_top, logits.size());
  if (n_top == 0) return out;
  // Keep the n_top best in a small sorted buffer: O(n_vocab * n_top) worst case, n_top <= 20.
  std::vector<TokenLogprob> best;
  best.reserve(n_top + 1);
  auto better = [&](const TokenLogprob& a, const TokenLogprob& b) {
    return logits[static_cast<size_t>(a.token)] > logits[static_cast<size_t>(b.token)] ||
           (logits[static_cast<size_t>(a.token)] == logits[static_cast<size_t>(b.token)] && a.token < b.token);
  };
  for (size_t i = 0; i < logits.size(); ++i) {
    if (best.size() == n_top && !(logits[i] > logits[static_cast<size_t>(best.back().token)])) continue;
    const TokenLogprob c{static_cast<TokenId>(i), 0};
    best.insert(std::upper_bound(best.begin(), best.end(), c, better), c);
    if (best.size() > n_top) best.pop_back();
  }
  for (auto& t : best) t.logprob = logprob_of(static_cast<size_t>(t.token));
  out.top = std::move(best);
  return out;
}

}  // namespace kestrel::runtime
