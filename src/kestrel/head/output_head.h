// The dense output head (LM head): logits over the whole vocabulary from final hidden states.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::head {

using TokenId = int32_t;

/// The output head of a model: logits z = softcap(W h), W = `weight` [n_vocab, d_model].
///
/// In an image built with FlashHead the rows of W are stored in cluster order: row r holds
/// token row_tokens[r] (docs/flashhead.md). `row_tokens` is empty when rows are in token order.
struct OutputHead {
  kernels::Matrix weight;
  /// Gemma's final logit soft-capping, z = cap * tanh(z / cap); 0 = none (Gemma 2 paper,
  /// arXiv 2408.00118, sec. 2; HF modeling_gemma3.py `final_logit_softcapping`).
  float final_softcap = 0.0f;
  std::span<const TokenId> row_tokens;  // [n_vocab] or empty
  std::vector<uint32_t> token_rows;     // inverse of row_tokens; empty when that is

  size_t n_vocab() const { return weight.rows; }
  /// The row of W that holds `token`.
  size_t row_of(TokenId token) const {
    return token_rows.empty() ? static_cast<size_t>(token) : token_rows[static_cast<size_t>(token)];
  }
  /// Sets row_tokens and fills token_rows. Throws kestrel::Error unless `order` is a
  /// permutation of 0..n_vocab-1.
  void set_row_order(std::span<const TokenId> order);
};

/// In place: z = cap * tanh(z / cap) for n values (nothing when cap <= 0).
void apply_softcap(float* z, size_t n, float cap);

/// Dense logits: logits[t, v] = softcap(W[row_of(v)] . hidden[t]) for t < n_rows, in token
/// order. hidden: float32 [n_rows, d_model]; logits: float32 [n_rows, n_vocab].
void dense_logits(const OutputHead& head, const float* hidden, size_t n_rows, float* logits,
                  ThreadPool& pool);

/// dense_logits in the head's row order: logits[t, r] = softcap(W[r] . hidden[t]), the logit of
/// token row_tokens[r] (of token r where row_tokens is empty), the same bits. For consumers that
/// need no token order (a log-softmax, a rank, a top-n: prompt scoring), which then skip the
/// permutation of every row. Shapes as dense_logits.
void dense_logits_row_order(const OutputHead& head, const float* hidden, size_t n_rows, float* logits,
                            ThreadPool& pool);

/// Exact logits of the listed tokens only: logits[i] = softcap(W[row_of(tokens[i])] . hidden),
/// bit-identical to dense_logits' value for that token (the same per-row arithmetic). For a
/// grammar that allows few tokens (runtime/grammar.h). hidden: float32 [d_model]; logits:
/// float32 [tokens.size()]; token ids within the vocabulary.
void token_logits(const OutputHead& head, const float* hidden, std::span<const TokenId> tokens, float* logits,
                  ThreadPool& pool);

}  // namespace kestrel::head
