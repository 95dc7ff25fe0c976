// Scoring a prompt: the log-probability of each of its tokens given the ones before it (the
// `echo` + `logprobs` and `prompt_logprobs` of /v1/completions, lm-eval's loglikelihood). A
// prefill that keeps every row: the layers in ubatches of the model's largest batch, then the
// dense head and a log-softmax per row, rows_per_pass rows at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kestrel/runtime/logprobs.h"

namespace kestrel::runtime {

class Session;

struct PromptScoringOptions {
  size_t n_top = 0;            // alternatives per position (StepLogprobs::top), <= the vocabulary
  size_t rows_per_pass = 64;   // logit rows held at once (each n_vocab floats)
};

/// The scores of a prompt's tokens but the first (steps[i] and ranks[i] belong to token i + 1).
struct PromptScores {
  std::vector<StepLogprobs> steps;
  /// 1-based rank of the token among the vocabulary (1: the most likely; ties share the best).
  std::vector<uint32_t> ranks;
};

/// Appends `tokens` to `session`'s cache (after what it holds) and returns the scores of every
/// token but the first: out[i] is token[i + 1] under the model's distribution after tokens
/// [0, i] (the cache's earlier positions included), with the n_top most likely tokens there.
/// Log-softmax over the whole vocabulary with the dense head (FlashHead is not used: its
/// candidates would not hold every token), in double precision, as runtime::perplexity scores.
/// Throws kestrel::Error when the tokens do not fit in the cache or an id is outside the
/// vocabulary (the cache is then unchanged only if the first ubatch failed).
PromptScores score_tokens(Session& session, std::span<const TokenId> tokens,
                                       const PromptScoringOptions& options);

}  // namespace kestrel::runtime
