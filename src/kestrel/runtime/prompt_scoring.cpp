#include "kestrel/runtime/prompt_scoring.h"

#include <algorithm>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/head/output_head.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/session.h"

namespace kestrel::runtime {

PromptScores score_tokens(Session& session, std::span<const TokenId> tokens, const PromptScoringOptions& options) {
  PromptScores out;
  if (tokens.size() < 2) {
    if (!tokens.empty()) session.eval(tokens);
    return out;
  }
  Engine& engine = session.engine();
  const model::Model& model = engine.model();
  const size_t d_model = model.info().d_model, n_vocab = model.info().n_vocab;
  const head::OutputHead& head = model.output_head();
  const size_t ubatch = std::max<size_t>(1, model.max_batch_tokens());
  const size_t per_pass = std::max<size_t>(1, options.rows_per_pass);
  out.steps.resize(tokens.size() - 1);
  out.ranks.resize(tokens.size() - 1);
  std::vector<float> hidden(ubatch * d_model);
  std::vector<float> logits(per_pass * n_vocab);
  // Row r of the whole prompt predicts token r + 1; the last token's row predicts nothing here.
  for (size_t start = 0; start < tokens.size(); start += ubatch) {
    const size_t n = std::min(ubatch, tokens.size() - start);
    model.forward_hidden(tokens.subspan(start, n), session.cache(), model::Logits::kAll, hidden.data(), engine.pool());
    const size_t scored = std::min(n, tokens.size() - 1 - start);  // rows with a next token
    for (size_t r0 = 0; r0 < scored; r0 += per_pass) {
      const size_t rows = std::min(per_pass, scored - r0);
      // In the head's row order (FlashHead images store it by cluster): the log-softmax, the
      // top-n and the rank need no token order, so no row is permuted.
      head::dense_logits_row_order(head, hidden.data() + r0 * d_model, rows, logits.data(), engine.pool());
      engine.pool().parallel_for(rows, 1, [&](size_t lo, size_t hi) {
        for (size_t r = lo; r < hi; ++r) {
          const size_t pos = start + r0 + r;
          const std::span<const float> row(logits.data() + r * n_vocab, n_vocab);
          const TokenId next = tokens[pos + 1];
          if (next < 0 || static_cast<size_t>(next) >= n_vocab) {
            throw Error("logprobs: token " + std::to_string(next) + " outside the vocabulary");
          }
          const size_t at = head.row_of(next);
          out.steps[pos] = compute_logprobs_at(row, head.row_tokens, at, options.n_top);
          const float mine = row[at];
          out.ranks[pos] = 1 + static_cast<uint32_t>(std::count_if(row.begin(), row.end(), [&](float l) { return l > mine; }));
        }
      });
    }
  }
  return out;
}

}  // namespace kestrel::runtime
