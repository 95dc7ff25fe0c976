// One sequence on a shared Engine: its KV cache (with the token ids it holds), the scratch
// buffers of a step, and generation with prefix reuse.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "kestrel/head/flashhead.h"
#include "kestrel/model/kv_cache.h"
#include "kestrel/runtime/generate_options.h"
#include "kestrel/runtime/sampler.h"

namespace kestrel::runtime {

class Engine;

/// A sequence. Sessions of one Engine share its weights, tokenizer, heads and thread pool; each
/// owns a KV cache of engine.n_ctx() positions. Not thread-safe: one call at a time per Session,
/// and (the thread pool being shared) one Session of an Engine computing at a time.
class Session {
 public:
  /// Allocates the KV cache. Throws kestrel::Error when it does not fit in memory.
  explicit Session(Engine& engine);

  Engine& engine() const { return engine_; }
  const model::KvCache& cache() const { return cache_; }
  model::KvCache& cache() { return cache_; }
  /// Token ids whose keys and values the cache holds (the prompt and the generated tokens fed
  /// back, not the last sampled token).
  std::span<const TokenId> cached_tokens() const { return cache_.tokens(); }

  /// Starts a new sequence (empties the KV cache, keeps its memory).
  void reset() { cache_.clear(); }
  /// Keeps the longest prefix of the cache that `prompt` starts with, leaving at least the last
  /// min(prompt.size(), kernels::kTileMinTokens) prompt tokens to feed (the last one scores the
  /// next token; the last rows of a prompt go through prefill tiles, as in a cold run), and
  /// exact under KvCache::truncate's rule. Returns the number of positions kept: the tokens of the prompt
  /// that need no prefill.
  size_t reuse_prefix(std::span<const TokenId> prompt);
  /// What reuse_prefix(prompt) would keep, without changing anything.
  size_t reusable_prefix(std::span<const TokenId> prompt) const;

  /// Appends `tokens` to the sequence and returns the logits of the last one ([n_vocab]).
  /// Throws kestrel::Error if they do not fit in the context.
  std::span<float> eval(std::span<const TokenId> tokens);
  /// Appends `tokens` and scores the next token with the engine's head: the dense logits, or
  /// FlashHead's candidates (TokenScores::ids set). Valid until the next call.
  TokenScores step(std::span<const TokenId> tokens);
  /// Appends `tokens` (1 .. kMaxDraft + 1 of them: a decode step's token and its draft) and
  /// scores the next token after each of them: row i is what step() of tokens[0..i] one at a
  /// time would return, bit for bit. Valid until the next call.
  std::span<const TokenScores> step_rows(std::span<const TokenId> tokens);
  /// The last-token hidden state buffer, float32 [d_model], that step() fills and score() reads
  /// (a batched forward writes it directly: Model::forward_batch's BatchSequence::hidden).
  float* hidden() { return hidden_.data(); }
  /// Scores the next token from hidden() with the engine's head (as step() does after the
  /// forward). Valid until the next call.
  TokenScores score();
  /// score() of several Sessions of one Engine at once (the rows of a batched step): out[i] is
  /// what sessions[i]->score() returns, bit for bit, but FlashHead reads its centroids once for
  /// all rows and each probed cluster once (FlashHead::search_batch). Sessions distinct;
  /// out.size() == sessions.size().
  static void score_batch(std::span<Session* const> sessions, std::span<TokenScores> out);

  /// Rescoring for a grammar (runtime/grammar.h) when FlashHead's candidates do not serve: the
  /// hidden state of row `row` of the last scoring (step, score, score_batch: row 0; step_rows:
  /// row i) scored again by the dense head — only the listed `tokens` (exact, bit-identical to
  /// the dense logits of those tokens), or, with `tokens` empty, the whole vocabulary. Valid
  /// until the next call; the earlier scores stay valid. Throws kestrel::Error for a row the
  /// last scoring did not have.
  TokenScores rescore(size_t row, std::span<const TokenId> tokens);
  /// The hidden state, float32 [d_model], that row `row` of the last scoring was scored from
  /// (what rescore reads; the drafters' DraftRequest::target_hidden). Valid until the next
  /// call; empty for a row the last scoring did not have.
  std::span<const float> scored_hidden(size_t row) const;

  /// This sequence's Session on the engine's draft model (Engine::load_draft_model), created on
  /// first use and kept with this Session (its cache then shares the sequence's prefix from one
  /// request to the next). Throws kestrel::Error when the engine has no draft model.
  Session& draft_session();

  /// Runs the prompt (after the cached prefix when options.cache_prompt, else from an empty
  /// cache), then samples up to max_tokens tokens: a Generation (generation.h) stepped alone. GenerateResult::cached_tokens says how many
  /// prompt tokens the cache supplied. Throws kestrel::Error if the prompt is empty or does not
  /// fit the context.
  GenerateResult generate(std::span<const TokenId> prompt, const GenerateOptions& options,
                          const TextCallback& on_text = nullptr);

 private:
  Engine& engine_;
  model::KvCache cache_;
  std::vector<float> logits_;
  std::vector<float> hidden_;
  head::Candidates candidates_;
  // step_rows: per row hidden states, dense logits or candidates, and the scores handed out.
  std::vector<float> rows_hidden_, rows_logits_;
  std::vector<head::Candidates> rows_candidates_;
  std::vector<TokenScores> rows_scores_;
  // rescore(): the rows the last scoring read, and its own outputs.
  const float* scored_hidden_ = nullptr;
  size_t scored_rows_ = 0;
  std::vector<float> rescore_logits_;
  std::vector<TokenId> rescore_ids_;
  std::unique_ptr<Session> draft_session_;
};

}  // namespace kestrel::runtime
