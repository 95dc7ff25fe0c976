// Choosing the next token from logits.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kestrel::runtime {

using TokenId = int32_t;

/// Sampling settings, with llama.cpp's meanings (common/sampling.h, src/llama-sampling.cpp).
struct SamplerConfig {
  float temperature = 0.8f;     // <= 0: greedy (argmax, ties to the lower id)
  int top_k = 40;               // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off; keeps p >= min_p * p_max
  float repeat_penalty = 1.0f;  // 1: off; CTRL (Keskar et al. 2019): divide positive logits,
                                // multiply negative ones, for tokens in the last repeat_last_n
  int repeat_last_n = 64;
  uint64_t seed = 0xC0FFEE;
  // OpenAI's penalties over the same window as the repetition penalty: the logit of a token
  // seen c times drops by c * frequency_penalty + (c > 0) * presence_penalty.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
};

/// Logits to sample from: dense (`ids` empty: logits[i] belongs to token i) or sparse
/// (FlashHead candidates: logits[i] belongs to token ids[i]; every other token is -inf).
struct TokenScores {
  std::span<float> logits;
  std::span<const TokenId> ids;
  size_t size() const { return logits.size(); }
  TokenId id(size_t i) const { return ids.empty() ? static_cast<TokenId>(i) : ids[i]; }
};

/// Applies, in llama.cpp's default order: repetition (and presence/frequency) penalty, top-k,
/// top-p, min-p, temperature, then draws from the softmax with a seeded mt19937_64. On sparse scores the
/// same chain runs over the candidates only (docs/flashhead.md).
class Sampler {
 public:
  explicit Sampler(const SamplerConfig& config);
  /// `scores.logits` is modified in place by the penalty; `history` the tokens so far.
  TokenId sample(TokenScores scores, std::span<const TokenId> history);
  TokenId sample(std::span<float> logits, std::span<const TokenId> history) {
    return sample(TokenScores{logits, {}}, history);
  }
  /// The distribution sample() draws from: (token, probability) pairs, probabilities summing
  /// to 1, most likely first; one pair with probability 1 when greedy. Same side effects.
  std::vector<std::pair<TokenId, double>> distribution(TokenScores scores, std::span<const TokenId> history);
  const SamplerConfig& config() const { return config_; }
  /// The generator sample() draws from (speculative sampling draws its acceptance tests and
  /// resamples from it too, so that one seed gives one sequence).
  std::mt19937_64& rng() { return rng_; }

 private:
  /// Penalty, then the cuts; leaves the kept candidates in candidates_ and their weights.
  void filter(TokenScores scores, std::span<const TokenId> history, std::vector<double>& weights);

  SamplerConfig config_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, TokenId>> candidates_;
};

/// Index of the largest logit, the lowest index on ties.
TokenId argmax(std::span<const float> logits);
/// The token with the largest score, the lowest token id on ties.
TokenId argmax(const TokenScores& scores);

}  // namespace kestrel::runtime
