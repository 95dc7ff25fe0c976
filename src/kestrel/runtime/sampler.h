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
  // OpenAI's penalties (0: off), over the same last repeat_last_n tokens: the logit of a token
  // seen c times drops by c * frequency_penalty + (c > 0) * presence_penalty.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0xC0FFEE;
};

/// Applies, in llama.cpp's default order: repetition (and presence/frequency) penalty, top-k, top-p, min-p,
/// temperature, then draws from the softmax with a seeded mt19937_64.
class Sampler {
 public:
  explicit Sampler(const SamplerConfig& config);
  /// `logits` [n_vocab] float32 (modified in place by the penalty); `history` the tokens so far.
  TokenId sample(std::span<float> logits, std::span<const TokenId> history);
  const SamplerConfig& config() const { return config_; }

 private:
  void apply_presence_frequency(std::span<float> logits, std::span<const TokenId> history) const;

  SamplerConfig config_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, TokenId>> candidates_;
};

/// Index of the largest logit, the lowest index on ties.
TokenId argmax(std::span<const float> logits);

}  // namespace kestrel::runtime
