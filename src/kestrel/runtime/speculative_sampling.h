// The acceptance rule of speculative sampling (Leviathan, Kalman & Matias 2023, "Fast Inference
// from Transformers via Speculative Decoding", Algorithm 1; Chen et al. 2023, "Accelerating
// Large Language Model Decoding with Speculative Sampling", Algorithm 2), as a pure function
// over the two distributions, the drafted token and a random generator.
//
// Why it is exact: a token x drafted with probability q(x) is kept with probability
// min(1, p(x)/q(x)), so token t comes out accepted with probability min(q(t), p(t)); a draft
// is rejected with probability beta = sum_t max(0, q(t) - p(t)) = sum_t max(0, p(t) - q(t)),
// and a rejection emits t with probability max(0, p(t) - q(t)) / beta. In total
// min(q, p) + max(0, p - q) = p: the emitted token is distributed as p, whatever q is.
#pragma once

#include <random>

#include "kestrel/runtime/drafter.h"

namespace kestrel::runtime {

struct SpeculativeOutcome {
  TokenId token = 0;      // the emitted token: the draft when accepted, else the resampled one
  bool accepted = false;  // true iff the draft was kept (then token == the draft)
};

/// One verification row of speculative sampling. `p`: the target's distribution at this row
/// (after the whole logits-processor chain: penalties, top-k/top-p/min-p, temperature, over
/// the FlashHead candidates or the dense vocabulary); `q`: the distribution `draft` was drawn
/// from, with q(draft) > 0. Draws u ~ U[0, 1) from `rng` and keeps `draft` iff
/// u * q(draft) < p(draft); otherwise draws a second number and emits a token from
/// norm(max(0, p - q)) (from p itself in the only case where that residual vanishes in floating
/// point, p == q to rounding, where a rejection has probability ~0). Throws kestrel::Error when
/// q(draft) is not positive or p is empty.
SpeculativeOutcome speculative_accept(const TokenDistribution& p, const TokenDistribution& q, TokenId draft,
                                      std::mt19937_64& rng);

/// A token drawn from `d` (inverse CDF over its pairs in order, one U[0, 1) from `rng`).
/// Throws kestrel::Error when d is empty.
TokenId draw_token(const TokenDistribution& d, std::mt19937_64& rng);

/// d(token): the probability `d` gives `token` (0 when absent).
double probability_of(const TokenDistribution& d, TokenId token);

}  // namespace kestrel::runtime
