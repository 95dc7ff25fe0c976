// Sentence embeddings from a language model: the final hidden states of a prompt's tokens (after
// the output norm, what llama.cpp's pooling reads) pooled into one vector and L2-normalized
// (`kestrel serve --embeddings --pooling mean|last|cls`, /v1/embeddings). On a causal LM these
// are pooled hidden states, not a trained embedding model's vectors.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kestrel::runtime {

/// How a prompt's hidden rows become one vector. kNone: no embedding (a generation).
/// kMean: the average of every token's row; kLast: the last token's row; kCls: the first
/// token's row (on a causal model that row sees only the first token: with a BOS, the same
/// vector for every input).
enum class Pooling { kNone, kMean, kLast, kCls };

/// "none", "mean", "last", "cls" -> Pooling; kestrel::Error naming the choices otherwise.
Pooling parse_pooling(const std::string& name);
/// The name parse_pooling reads.
const char* pooling_name(Pooling pooling);

/// Accumulates the hidden rows of one sequence, in token order, a ubatch at a time.
class HiddenPool {
 public:
  /// `pooling` must not be kNone (kestrel::Error); `d_model` > 0.
  HiddenPool(Pooling pooling, size_t d_model);
  /// Rows `rows` float32 [n, d_model]: the sequence's next n tokens' final hidden states.
  void add(const float* rows, size_t n);
  size_t tokens() const { return tokens_; }
  /// The pooled vector, float32 [d_model], L2-normalized (a zero vector stays zero).
  /// kestrel::Error when no row was added.
  std::vector<float> finish() const;

 private:
  Pooling pooling_;
  size_t d_;
  size_t tokens_ = 0;
  std::vector<double> acc_;  // kMean: the running sum (double); kLast / kCls: the row kept
};

}  // namespace kestrel::runtime
