// Perplexity of a model on a text, and its KL divergence from a base model, the way
// llama.cpp's llama-perplexity measures them (tools/perplexity/perplexity.cpp):
//
//   * the text is tokenized whole, BOS first when the model wants one;
//   * the tokens are cut into consecutive chunks of n_ctx (a partial last chunk is dropped, and
//     at least 2 * n_ctx tokens are required, as llama.cpp does);
//   * each chunk is evaluated from an empty KV cache, its first token replaced by BOS;
//   * only the second half is scored: the logits at positions j = n_ctx/2 .. n_ctx-2 predict
//     token j+1, so n_ctx - n_ctx/2 - 1 positions per chunk;
//   * perplexity = exp(mean NLL), its error exp(mean) * sqrt(var(NLL) / (count - 1)).
//
// With a base model, each scored position also gets KL(base || model) over the whole vocabulary
// and whether both models' argmax agree (llama.cpp's "same top p"). Log-softmax is computed in
// double precision over every vocabulary entry (llama.cpp keeps 16-bit base log-probabilities
// and skips base probabilities below e^-16 in the KL sum; the difference is negligible).
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "kestrel/model/model.h"
#include "kestrel/runtime/engine.h"

namespace kestrel::runtime {

struct PerplexityOptions {
  size_t n_ctx = 512;       // tokens per chunk (>= 4, <= the model's context length)
  size_t max_chunks = 0;    // 0: every whole chunk of the text
  size_t rows_per_pass = 64;  // logit rows held in memory at once per model (each n_vocab floats)
};

struct PerplexityResult {
  size_t n_ctx = 0;
  size_t n_tokens = 0;   // tokens of the whole text (BOS included)
  size_t n_chunks = 0;   // chunks evaluated
  size_t n_scored = 0;   // positions scored: n_chunks * (n_ctx - n_ctx/2 - 1)
  double ppl = 0;        // exp(mean NLL) of the model
  double ppl_error = 0;  // llama.cpp's "+/-": ppl * sqrt(var(NLL) / (n_scored - 1))
  double seconds = 0;    // wall time of the evaluation

  // With a base model (has_base):
  bool has_base = false;
  double base_ppl = 0;
  double base_ppl_error = 0;
  double kl_mean = 0;        // mean KL(base || model), nats
  double kl_mean_error = 0;  // standard error of the mean
  double kl_p99 = 0;         // 99th percentile (llama.cpp's linear interpolation)
  double kl_max = 0;
  double same_top1_pct = 0;  // % of positions where both argmax agree (lowest id on ties)
};

/// Called after every chunk with its number (1-based), the total and the running results
/// (percentiles are filled in only in the final result).
using PerplexityProgress =
    std::function<void(size_t chunk, size_t n_chunks, const PerplexityResult& so_far)>;

/// Perplexity of `model` on `tokens` (the whole text, as Engine::encode returns it).
/// Throws kestrel::Error when n_ctx is below 4 or above the model's context length, or when
/// there are fewer than 2 * n_ctx tokens.
PerplexityResult perplexity(Engine& model, std::span<const model::TokenId> tokens,
                            const PerplexityOptions& options,
                            const PerplexityProgress& progress = nullptr);

/// Perplexity of `model` and of `base`, and KL(base || model), on the same chunks.
/// Also throws kestrel::Error when the two vocabularies differ in size.
PerplexityResult perplexity(Engine& model, Engine& base, std::span<const model::TokenId> tokens,
                            const PerplexityOptions& options,
                            const PerplexityProgress& progress = nullptr);

// The math, exposed for tests. All in double precision.

/// log(sum_i exp(logits[i])), computed as max + log(sum_i exp(logits[i] - max)).
double log_sum_exp(std::span<const float> logits);
/// log_softmax(logits)[i] = logits[i] - log_sum_exp(logits).
std::vector<double> log_softmax(std::span<const float> logits);
/// -log softmax(logits)[token].
double negative_log_likelihood(std::span<const float> logits, model::TokenId token);
/// KL(P || Q) = sum_i P_i (log P_i - log Q_i), P = softmax(base_logits), Q = softmax(logits).
/// Never negative (rounding below zero is clamped). Both spans must have the same size.
double kl_divergence(std::span<const float> base_logits, std::span<const float> logits);
/// llama.cpp's percentile of sorted values: linear interpolation at fraction * (size - 1).
double percentile(std::span<const double> sorted, double fraction);

struct PerplexityEstimate {
  double ppl = 0;
  double error = 0;
};
/// exp(mean) and its error from the sum of NLLs, the sum of their squares and their count.
PerplexityEstimate estimate_perplexity(double sum_nll, double sum_nll2, size_t count);

}  // namespace kestrel::runtime
