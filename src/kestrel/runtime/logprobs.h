// Log-probabilities of tokens from a logits vector (OpenAI's `logprobs` / `top_logprobs`).
#pragma once

#include <span>
#include <vector>

#include "kestrel/runtime/sampler.h"

namespace kestrel::runtime {

/// One candidate token and its natural-log probability under softmax(logits).
struct TokenLogprob {
  TokenId token = 0;
  float logprob = 0;
};

/// The chosen token of one decode step with its log-probability and, when asked for, the
/// most likely alternatives (highest first, ties to the lower id).
struct StepLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
};

/// log-softmax of `logits` ([n_vocab] float32, unmodified) evaluated at `chosen`, plus the
/// `n_top` most likely tokens. The distribution is the model's own (temperature 1, no
/// penalties), as OpenAI reports it. n_top is clamped to the vocabulary size.
/// Throws kestrel::Error when `chosen` is outside the vocabulary or logits is empty.
StepLogprobs compute_logprobs(std::span<const float> logits, TokenId chosen, size_t n_top);

/// The same over sparse scores (FlashHead candidates: logits[i] belongs to token ids[i]; ids
/// empty means dense): the log-softmax is taken over the candidates only (docs/flashhead.md).
/// Throws kestrel::Error when `chosen` is not a candidate.
StepLogprobs compute_logprobs(std::span<const float> logits, std::span<const TokenId> ids,
                              TokenId chosen, size_t n_top);

/// The same with the chosen token given by its position `at` in logits (token ids[at], or at
/// where ids is empty): no search of ids (a dense row in the head's row order: prompt scoring).
/// Throws kestrel::Error when `at` is past the logits.
StepLogprobs compute_logprobs_at(std::span<const float> logits, std::span<const TokenId> ids, size_t at,
                                 size_t n_top);

}  // namespace kestrel::runtime
