// One request's generation on a Session, advanced one forward pass at a time, so that a
// scheduler can run the steps of several generations in one batched forward (and interleave a
// long prompt's prefill chunks with other sequences' decode steps). Session::generate is the
// loop over these steps for one sequence alone.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kestrel/runtime/drafter.h"
#include "kestrel/runtime/generate_options.h"
#include "kestrel/runtime/grammar.h"
#include "kestrel/runtime/pooling.h"
#include "kestrel/runtime/sampler.h"
#include "kestrel/text/tokenizer.h"

namespace kestrel::runtime {

class Session;

class Generation {
 public:
  /// Validates the prompt and prepares the session's cache: keeps the reusable prefix when
  /// options.cache_prompt, else empties it. Throws kestrel::Error for an empty prompt or one
  /// that does not fit the context. `session` and `prompt`'s storage must outlive the
  /// Generation (options and on_text are copied).
  Generation(Session& session, std::span<const TokenId> prompt, const GenerateOptions& options,
             const TextCallback& on_text);

  Session& session() { return session_; }
  bool done() const { return done_; }
  /// True while prompt tokens remain to be prefilled.
  bool prefilling() const { return next_prompt_ < prompt_.size(); }

  /// Speculative decoding: while decoding, asks the drafter (GenerateOptions::draft) for a
  /// draft to verify in the next step, which input() then returns after the last sampled token.
  /// Call it only for a step that will feed the draft (advance_rows): a request that runs in a
  /// batch with others feeds one token per step and does not draft (a draft model would run for
  /// nothing). Does nothing while prefilling, when done, without a drafter, or when this step
  /// already has its draft. Throws what the drafter throws.
  void draft();
  /// The tokens to feed next: up to `max_tokens` (>= 1) of the prompt still to prefill, else
  /// the last sampled token followed by the current draft (if draft() made one), cut to
  /// max_tokens. Empty when done().
  std::span<const TokenId> input(size_t max_tokens) const;
  /// After the caller fed `n` tokens of input() to the session's cache: when they complete the
  /// prompt, or during decode, `scores` are the next token's scores (Session::score) and one
  /// token is sampled, emitted and checked against the stop conditions; while the prompt is
  /// still incomplete `scores` are not read. Throws kestrel::Error if `n` is not a prefix of
  /// input()'s length.
  void advance(size_t n, TokenScores scores);
  /// Decode with a draft: the caller fed n >= 1 tokens of input() (the last sampled token and
  /// n - 1 drafted ones) and `rows` are the scores after each of them (rows.size() == n). Row j
  /// decides on the draft token fed after it (GenerateOptions::draft_accept): kExact samples the
  /// row as advance() would one step at a time and keeps the draft token iff it equals the
  /// sample; kDistribution (at temperature > 0) applies speculative sampling
  /// (speculative_accept) to the row's distribution and the draft's q. Rows go on while drafts
  /// are kept; the row after the last kept draft token samples a token of its own. Then the
  /// session's cache is cut back to the positions whose tokens were kept. Throws kestrel::Error
  /// if not decoding or the sizes disagree.
  void advance_rows(size_t n, std::span<const TokenScores> rows);
  /// True when advance(n, ...) will sample, i.e. feeding n tokens of input() needs scores.
  bool needs_scores(size_t n) const {
    return !pool_ && (!prefilling() || next_prompt_ + n >= prompt_.size());
  }
  /// Embeddings (GenerateOptions::pooling): the caller must feed every prompt row's final hidden
  /// state to pool_rows() before advance().
  bool pools() const { return pool_.has_value(); }
  /// Embeddings: `rows`, float32 [n, d_model], the final hidden states of the n prompt tokens
  /// input() gave last. kestrel::Error when this generation does not pool.
  void pool_rows(const float* rows, size_t n);

  /// Stops it as a client that went away does (GenerateResult::cancelled).
  void cancel() {
    stopped_by_client_ = true;
    done_ = true;
  }

  /// The result; call once done() (or to give up early: the text so far, finish "length").
  GenerateResult finish();

 private:
  using Clock = std::chrono::steady_clock;
  /// `row`: which row of the session's last scoring `scores` came from (for rescoring).
  void sample(TokenScores scores, size_t row);
  /// The scores the sampler draws from at this step: the tokens logit_bias raises added to
  /// FlashHead's candidates, the grammar's mask (with its rescoring), the biases, the logits kept
  /// for logprobs, stop tokens suppressed before min_tokens.
  TokenScores prepare(TokenScores scores, size_t row);
  /// Appends a chosen token: emits it and checks the stop conditions (sets done_).
  void commit(TokenId token, size_t row);
  TokenScores constrain(TokenScores scores, size_t row);
  void reset_draft();
  void emit(size_t end);
  void suppress_stop_tokens(TokenScores scores) const;
  /// FlashHead's candidates with every token that options.logit_bias raises and they lack,
  /// scored exactly (the scores as they are when none is missing, or when they are dense).
  TokenScores with_raised_tokens(TokenScores scores, size_t row);
  /// Adds options.logit_bias to the scores of the tokens present.
  void apply_logit_bias(TokenScores scores) const;

  Session& session_;
  std::span<const TokenId> prompt_;
  GenerateOptions options_;
  TextCallback on_text_;
  GenerateResult result_;
  Sampler sampler_;
  std::vector<TokenId> history_;
  text::StreamDecoder decoder_;
  size_t next_prompt_ = 0;  // prompt tokens fed so far (the cached ones included)
  size_t emitted_ = 0;      // bytes of result_.text passed to on_text
  bool stopped_by_client_ = false;
  bool done_ = false;
  TokenId last_ = 0;
  size_t last_row_ = 0;  // the row of the session's last scoring that last_ was sampled from
  std::unique_ptr<Drafter> drafter_;
  bool drafted_ = false;  // draft() ran for the coming step
  std::vector<TokenDistribution> draft_q_;  // the draft's q (empty: point masses)
  std::optional<TokenConstraint> constraint_;
  std::optional<HiddenPool> pool_;  // embeddings: the prompt's hidden rows pooled
  std::vector<TokenId> allowed_;  // the grammar's allowed tokens, when few
  std::vector<TokenId> raised_;   // candidates and the tokens logit_bias raises (with_raised_tokens)
  std::vector<uint8_t> bias_seen_;  // per logit_bias entry: among this step's candidates
  std::vector<TokenId> decode_input_;  // last_, then the draft
  Clock::time_point t0_, t_first_;
  double prefill_ms_ = 0;  // with max_tokens 0 (no first token, no ttft): the prefill's time
  std::vector<float> raw_logits_;  // serving: the model's logits before penalties, for logprobs
  std::vector<TokenId> raw_ids_;   // their token ids when FlashHead scored a candidate set
};

}  // namespace kestrel::runtime
