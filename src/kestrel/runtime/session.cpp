#include "kestrel/runtime/session.h"

#include <algorithm>

#include "kestrel/base/error.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/generation.h"

namespace kestrel::runtime {

Session::Session(Engine& engine)
    : engine_(engine),
      cache_(engine.model().new_cache(engine.n_ctx())),
      logits_(engine.model().info().n_vocab),
      hidden_(engine.model().info().d_model) {}

std::span<float> Session::eval(std::span<const TokenId> tokens) {
  engine_.model().forward(tokens, cache_, model::Logits::kLast, logits_.data(), engine_.pool());
  return logits_;
}

TokenScores Session::step(std::span<const TokenId> tokens) {
  engine_.model().forward_hidden(tokens, cache_, model::Logits::kLast, hidden_.data(), engine_.pool());
  return score();
}

std::span<const TokenScores> Session::step_rows(std::span<const TokenId> tokens) {
  const size_t n = tokens.size(), d = engine_.model().info().d_model, v = engine_.model().info().n_vocab;
  if (n == 0 || n > kMaxDraft + 1) {
    throw Error("Session::step_rows: " + std::to_string(n) + " tokens, expected 1.." + std::to_string(kMaxDraft + 1));
  }
  rows_hidden_.resize(n * d);
  engine_.model().forward_hidden(tokens, cache_, model::Logits::kAll, rows_hidden_.data(), engine_.pool());
  scored_hidden_ = rows_hidden_.data(), scored_rows_ = n;
  rows_scores_.resize(n);
  const head::FlashHead* flash = engine_.flashhead();
  if (flash == nullptr) {
    rows_logits_.resize(n * v);
    head::dense_logits(engine_.model().output_head(), rows_hidden_.data(), n, rows_logits_.data(), engine_.pool());
    for (size_t i = 0; i < n; ++i) rows_scores_[i] = {std::span<float>(&rows_logits_[i * v], v), {}};
    return rows_scores_;
  }
  rows_candidates_.resize(std::max(rows_candidates_.size(), n));
  std::vector<const float*> hidden(n);
  std::vector<head::Candidates*> out(n);
  for (size_t i = 0; i < n; ++i) hidden[i] = &rows_hidden_[i * d], out[i] = &rows_candidates_[i];
  flash->search_batch(hidden, engine_.probes(), out, engine_.pool());
  for (size_t i = 0; i < n; ++i) rows_scores_[i] = {rows_candidates_[i].logits, rows_candidates_[i].ids};
  return rows_scores_;
}

TokenScores Session::score() {
  scored_hidden_ = hidden_.data(), scored_rows_ = 1;
  const head::FlashHead* flash = engine_.flashhead();
  if (flash == nullptr) {
    head::dense_logits(engine_.model().output_head(), hidden_.data(), 1, logits_.data(), engine_.pool());
    return {logits_, {}};
  }
  flash->search(hidden_.data(), engine_.probes(), candidates_, engine_.pool());
  return {candidates_.logits, candidates_.ids};
}

void Session::score_batch(std::span<Session* const> sessions, std::span<TokenScores> out) {
  if (sessions.size() != out.size()) throw Error("score_batch: sessions and outputs differ in number");
  if (sessions.empty()) return;
  Engine& engine = sessions[0]->engine_;
  const head::FlashHead* flash = engine.flashhead();
  if (flash == nullptr) {
    for (size_t i = 0; i < sessions.size(); ++i) out[i] = sessions[i]->score();
    return;
  }
  std::vector<const float*> hidden;
  std::vector<head::Candidates*> candidates;
  for (Session* s : sessions) {
    if (&s->engine_ != &engine) throw Error("score_batch: sessions of different engines");
    hidden.push_back(s->hidden_.data());
    candidates.push_back(&s->candidates_);
    s->scored_hidden_ = s->hidden_.data(), s->scored_rows_ = 1;
  }
  flash->search_batch(hidden, engine.probes(), candidates, engine.pool());
  for (size_t i = 0; i < sessions.size(); ++i) out[i] = {candidates[i]->logits, candidates[i]->ids};
}

TokenScores Session::rescore(size_t row, std::span<const TokenId> tokens) {
  if (scored_hidden_ == nullptr || row >= scored_rows_) throw Error("Session::rescore: no such scored row");
  const auto& head = engine_.model().output_head();
  const float* h = scored_hidden_ + row * engine_.model().info().d_model;
  if (tokens.empty()) {
    rescore_logits_.resize(head.n_vocab());
    head::dense_logits(head, h, 1, rescore_logits_.data(), engine_.pool());
    return {rescore_logits_, {}};
  }
  rescore_ids_.assign(tokens.begin(), tokens.end());
  rescore_logits_.resize(tokens.size());
  head::token_logits(head, h, rescore_ids_, rescore_logits_.data(), engine_.pool());
  return {rescore_logits_, rescore_ids_};
}

std::span<const float> Session::scored_hidden(size_t row) const {
  if (scored_hidden_ == nullptr || row >= scored_rows_) return {};
  const size_t d = engine_.model().info().d_model;
  return {scored_hidden_ + row * d, d};
}

Session& Session::draft_session() {
  if (!draft_session_) {
    Engine* draft = engine_.draft_model();
    if (draft == nullptr) throw Error("speculative decoding with a draft model, but none was loaded (--draft IMAGE)");
    draft_session_ = std::make_unique<Session>(*draft);
  }
  return *draft_session_;
}

namespace {

// The prompt tokens a session may keep: the common prefix of positions that chunks of prefill
// size wrote (as a cold run writes a prompt), leaving the last min(prompt.size(),
// kTileMinTokens) of them to feed (prompt not empty, so at least the last, which scores the next
// token): a cold run prefills a prompt's rows by prefill tiles, and rows that decode steps, a
// verification or a short prompt wrote, or a shorter rest fed now, round differently (a greedy
// near-tie could then answer otherwise than the cold run: a 2-token prompt's first position,
// reused by every later prompt, changed their answers).
size_t keepable(const model::KvCache& cache, std::span<const TokenId> prompt) {
  const size_t common = model::common_prefix(cache.tokens().first(cache.prefilled()), prompt);
  return std::min(common, prompt.size() - std::min(prompt.size(), kernels::kTileMinTokens));
}

}  // namespace

size_t Session::reusable_prefix(std::span<const TokenId> prompt) const {
  if (prompt.empty()) return 0;
  return cache_.exact_prefix(keepable(cache_, prompt));
}

size_t Session::reuse_prefix(std::span<const TokenId> prompt) {
  if (prompt.empty()) return 0;
  return cache_.truncate(keepable(cache_, prompt));
}

GenerateResult Session::generate(std::span<const TokenId> prompt, const GenerateOptions& options,
                                const TextCallback& on_text) {
  Generation g(*this, prompt, options, on_text);
  while (!g.done()) {
    g.draft();
    const auto in = g.input(std::max(prompt.size(), kMaxDraft + 1));
    if (g.pools()) {  // embeddings: every prompt row's hidden state
      std::vector<float> rows(in.size() * engine_.model().info().d_model);
      engine_.model().forward_hidden(in, cache_, model::Logits::kAll, rows.data(), engine_.pool());
      g.pool_rows(rows.data(), in.size());
      g.advance(in.size(), {});
    } else if (!g.prefilling() && in.size() > 1) {
      g.advance_rows(in.size(), step_rows(in));
    } else {
      g.advance(in.size(), step(in));
    }
  }
  return g.finish();
}

}  // namespace kestrel::runtime
