#include "kestrel/runtime/logprobs.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/kernels/ops.h"

namespace kestrel::runtime {

StepLogprobs compute_logprobs(std::span<const float> logits, TokenId chosen, size_t n_top) {
  return compute_logprobs(logits, {}, chosen, n_top);
}

StepLogprobs compute_logprobs(std::span<const float> logits, std::span<const TokenId> ids,
                              TokenId chosen, size_t n_top) {
  if (logits.empty()) throw Error("logprobs: empty logits");
  // Position i holds token ids[i] (i where ids is empty); `chosen` sits at position `at`.
  size_t at = 0;
  if (ids.empty()) {
    if (chosen < 0 || static_cast<size_t>(chosen) >= logits.size()) {
      throw Error("logprobs: token " + std::to_string(chosen) + " outside the vocabulary");
    }
    at = static_cast<size_t>(chosen);
  } else {
    const auto it = std::find(ids.begin(), ids.end(), chosen);
    if (it == ids.end()) throw Error("logprobs: token " + std::to_string(chosen) + " is not a candidate");
    at = static_cast<size_t>(it - ids.begin());
  }
  return compute_logprobs_at(logits, ids, at, n_top);
}

StepLogprobs compute_logprobs_at(std::span<const float> logits, std::span<const TokenId> ids, size_t at,
                                 size_t n_top) {
  if (at >= logits.size() || (!ids.empty() && ids.size() != logits.size())) {
    throw Error("logprobs: position " + std::to_string(at) + " outside " + std::to_string(logits.size()) + " logits");
  }
  auto id_of = [&](size_t i) { return ids.empty() ? static_cast<TokenId>(i) : ids[i]; };
  const TokenId chosen = id_of(at);
  // Stable log-sum-exp: max first, then the sum of exp(l - max) in double.
  float max_logit = logits[0];
  for (float l : logits) max_logit = std::max(max_logit, l);
  const double sum = kernels::sum_exp_shifted(logits.data(), logits.size(), static_cast<double>(max_logit));
  const double log_z = static_cast<double>(max_logit) + std::log(sum);
  auto logprob_of = [&](size_t i) { return static_cast<float>(static_cast<double>(logits[i]) - log_z); };

  StepLogprobs out;
  out.chosen = {chosen, logprob_of(at)};
  n_top = std::min(n_top, logits.size());
  if (n_top == 0) return out;
  // Keep the n_top best positions in a small sorted buffer: O(n * n_top) worst case, n_top <= 20.
  std::vector<size_t> best;
  best.reserve(n_top + 1);
  auto better = [&](size_t a, size_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && id_of(a) < id_of(b));
  };
  for (size_t i = 0; i < logits.size(); ++i) {
    if (best.size() == n_top && !better(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
    if (best.size() > n_top) best.pop_back();
  }
  for (size_t i : best) out.top.push_back({id_of(i), logprob_of(i)});
  return out;
}

}  // namespace kestrel::runtime
