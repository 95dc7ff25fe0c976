#include "kestrel/runtime/generation.h"

#include <algorithm>
#include <cmath>

#include "kestrel/base/error.h"
#include "kestrel/runtime/draft_model.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/mtp_drafter.h"
#include "kestrel/runtime/prompt_scoring.h"
#include "kestrel/runtime/session.h"
#include "kestrel/runtime/speculative_sampling.h"

namespace kestrel::runtime {
namespace {

double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string: that
// much text must be held back while streaming, as the next token may complete the match.
size_t held_back(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& stop : stops) {
    for (size_t len = std::min(stop.size() - 1, text.size()); len > hold; --len) {
      if (text.substr(text.size() - len) == std::string_view(stop).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

// Bias entries (ids ascending) matching a candidate, found by one binary search per candidate:
// O(candidates x log biases) a step, not candidates x biases (16,384 x up to 1,024 on FlashHead).
const std::pair<TokenId, float>* find_bias(std::span<const std::pair<TokenId, float>> bias, TokenId token) {
  const auto it = std::lower_bound(bias.begin(), bias.end(), std::make_pair(token, -INFINITY));
  return it != bias.end() && it->first == token ? &*it : nullptr;
}

}  // namespace

Generation::Generation(Session& session, std::span<const TokenId> prompt, const GenerateOptions& options,
                       const TextCallback& on_text)
    : session_(session),
      prompt_(prompt),
      options_(options),
      on_text_(on_text),
      sampler_(options.sampler),
      history_(prompt.begin(), prompt.end()),
      decoder_(session.engine().tokenizer(), options.render_special) {
  const size_t n_ctx = session.engine().n_ctx();
  if (prompt.empty()) throw Error("the prompt is empty");
  if (prompt.size() >= n_ctx) {
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens, which does not fit the context of " +
                std::to_string(n_ctx) + " tokens (raise --ctx or shorten the prompt)");
  }
  const size_t n_vocab = session.engine().model().info().n_vocab;
  for (size_t i = 0; i < options.logit_bias.size(); ++i) {
    const TokenId t = options.logit_bias[i].first;
    if (t < 0 || static_cast<size_t>(t) >= n_vocab) {
      throw Error("logit bias for token " + std::to_string(t) + ", outside the vocabulary of " + std::to_string(n_vocab));
    }
    if (i > 0 && t <= options.logit_bias[i - 1].first) throw Error("logit biases must name distinct tokens, ids ascending");
  }
  result_.prompt_tokens = prompt.size();
  result_.finish_reason = "length";
  t0_ = Clock::now();
  if (options.pooling != Pooling::kNone) {
    // Embeddings: a prefill of every row from an empty cache; nothing is sampled.
    session.reset();
    pool_.emplace(options.pooling, session.engine().model().info().d_model);
    return;
  }
  if (options.prompt_logprobs >= 0) {
    // Scoring: every prompt row, as one prefill (on the scheduler's thread, which owns the
    // model). Then the last rows go again through the ordinary prefill (reuse_prefix leaves
    // them), so that the next token is scored as a cold run scores it.
    session.reset();
    PromptScores scores = score_tokens(session, prompt, {static_cast<size_t>(options.prompt_logprobs)});
    result_.prompt_logprobs = std::move(scores.steps);
    result_.prompt_ranks = std::move(scores.ranks);
    next_prompt_ = session.reuse_prefix(prompt);
  } else {
    if (options.cache_prompt) {
      result_.cached_tokens = session.reuse_prefix(prompt);
    } else {
      session.reset();
    }
    next_prompt_ = result_.cached_tokens;
  }
  if (options.grammar) constraint_.emplace(options.grammar);
  const size_t draft_max = std::min(options.draft_max, kMaxDraft);
  if (draft_max > 0) {
    switch (options.draft) {
      case DraftMode::kNone:
        break;
      case DraftMode::kAuto:  // the image's own drafter (Gemma 4's MTP assistant), else n-gram
        if (const model::MtpAssistant* mtp = session.engine().mtp_assistant()) {
          drafter_ = std::make_unique<MtpDrafter>(*mtp, session, draft_max);
        } else {
          drafter_ = std::make_unique<NgramDrafter>(draft_max);
        }
        break;
      case DraftMode::kNgram:
        drafter_ = std::make_unique<NgramDrafter>(draft_max);
        break;
      case DraftMode::kModel:
        drafter_ = std::make_unique<ModelDrafter>(session.draft_session(), draft_max, options.sampler);
        break;
    }
  }
}

void Generation::reset_draft() {
  decode_input_.assign(1, last_);
  draft_q_.clear();
  drafted_ = false;
}

void Generation::draft() {
  if (!drafter_ || done_ || prefilling() || drafted_) return;
  drafted_ = true;
  // Room for the draft: the tokens still allowed, and the context (the cache holds n_past
  // positions; the draft and last_ must fit, with one position to spare).
  const size_t generated = result_.tokens.size();
  const size_t n_past = session_.cache().n_past, n_ctx = session_.engine().n_ctx();
  size_t room = options_.max_tokens > generated + 1 ? options_.max_tokens - generated - 1 : 0;
  room = std::min(room, n_ctx > n_past + 2 ? n_ctx - n_past - 2 : 0);
  DraftRequest request;
  request.history = history_;
  request.limit = std::min(room, kMaxDraft);
  request.sample = options_.draft_accept == DraftAccept::kDistribution && options_.sampler.temperature > 0.0f;
  request.target_hidden = session_.scored_hidden(last_row_);
  Draft d = drafter_->draft(request);
  if (d.tokens.size() > request.limit || (!d.q.empty() && d.q.size() != d.tokens.size())) {
    throw Error("the drafter returned a draft longer than asked, or without a distribution per token");
  }
  decode_input_.assign(1, last_);
  decode_input_.insert(decode_input_.end(), d.tokens.begin(), d.tokens.end());
  draft_q_ = std::move(d.q);
}

std::span<const TokenId> Generation::input(size_t max_tokens) const {
  if (done_) return {};
  if (prefilling()) return prompt_.subspan(next_prompt_, std::min(max_tokens, prompt_.size() - next_prompt_));
  return std::span<const TokenId>(decode_input_).first(std::clamp<size_t>(max_tokens, 1, decode_input_.size()));
}

void Generation::advance(size_t n, TokenScores scores) {
  if (done_ || n == 0 || n > input(n).size()) throw Error("Generation::advance: fed tokens that were not its input");
  if (prefilling()) {
    next_prompt_ += n;
    if (prefilling()) return;
    if (options_.max_tokens == 0 || pool_) {  // nothing to generate: the prefill alone is timed
      prefill_ms_ = ms_between(t0_, Clock::now());
      if (pool_) {
        if (pool_->tokens() != prompt_.size()) throw Error("Generation::advance: prompt rows were not pooled");
        result_.embedding = pool_->finish();
      }
      done_ = true;
      return;
    }
  }
  sample(scores, 0);
  reset_draft();
}

void Generation::pool_rows(const float* rows, size_t n) {
  if (!pool_) throw Error("Generation::pool_rows: this generation does not pool hidden states");
  pool_->add(rows, n);
}

void Generation::advance_rows(size_t n, std::span<const TokenScores> rows) {
  if (done_ || prefilling() || n == 0 || rows.size() != n || n > input(n).size()) {
    throw Error("Generation::advance_rows: rows that are not a decode step's input");
  }
  const std::vector<TokenId> fed(decode_input_.begin(), decode_input_.begin() + static_cast<std::ptrdiff_t>(n));
  model::KvCache& cache = session_.cache();
  const size_t n_past_before = cache.n_past - n;
  const bool distribution =
      options_.draft_accept == DraftAccept::kDistribution && options_.sampler.temperature > 0.0f;
  size_t kept = 0;  // rows whose sampled token was kept: the first, then each after a kept draft
  for (size_t j = 0; j < n; ++j) {
    kept = j + 1;
    if (!distribution || j + 1 == n) {
      // kExact, or the row after the whole draft: the token the sampler draws here.
      sample(rows[j], j);
      if (done_ || j + 1 == n || last_ != fed[j + 1]) break;
      continue;
    }
    // Speculative sampling: p is this row's distribution after the whole sampling chain (the
    // sampler's, over the same candidates), q the drafter's (a point mass when it gave none).
    const TokenScores scores = prepare(rows[j], j);
    const TokenDistribution p = sampler_.distribution(scores, history_);
    const TokenDistribution point{{fed[j + 1], 1.0}};
    const TokenDistribution& q = draft_q_.empty() ? point : draft_q_[j];
    const SpeculativeOutcome outcome = speculative_accept(p, q, fed[j + 1], sampler_.rng());
    commit(outcome.token, j);
    if (done_ || !outcome.accepted) break;
  }
  const size_t drafted = n - 1, accepted = kept - 1;
  result_.drafted_tokens += drafted;
  result_.accepted_tokens += accepted;
  if (drafter_) drafter_->verified(drafted, accepted);
  // The cache holds the n fed tokens; keep those whose next token was sampled from their row.
  if (kept < n && cache.truncate(n_past_before + kept) != n_past_before + kept) {
    throw Error("Generation::advance_rows: the KV cache could not roll back the rejected draft");
  }
  reset_draft();
}

// Serving: stop tokens get -inf so that min_tokens tokens come before the end of the turn.
void Generation::suppress_stop_tokens(TokenScores scores) const {
  for (const auto* ids : {&session_.engine().stop_tokens(), &options_.stop_token_ids}) {
    for (TokenId t : *ids) {
      if (scores.ids.empty()) {
        if (t >= 0 && static_cast<size_t>(t) < scores.size()) scores.logits[static_cast<size_t>(t)] = -INFINITY;
      } else {
        for (size_t i = 0; i < scores.size(); ++i) {
          if (scores.ids[i] == t) scores.logits[i] = -INFINITY;
        }
      }
    }
  }
}

void Generation::emit(size_t end) {
  if (end > emitted_ && on_text_ && !on_text_(std::string_view(result_.text).substr(emitted_, end - emitted_))) {
    stopped_by_client_ = true;
  }
  emitted_ = std::max(emitted_, end);
}

// The grammar's mask on this step's scores. Dense scores are masked in place. FlashHead's
// candidates are masked when some are allowed; a grammar that allows few tokens has exactly
// those scored instead, and one that allows none of the candidates has the dense head score
// the step (the candidates would otherwise force a token the grammar forbids).
TokenScores Generation::constrain(TokenScores scores, size_t row) {
  const size_t n_allowed = constraint_->update();
  if (n_allowed == 0) throw Error("the grammar allows no token here (it cannot continue)");
  if (scores.ids.empty()) {
    constraint_->apply(scores);
    return scores;
  }
  if (n_allowed <= kGrammarExactLimit) {
    constraint_->allowed_tokens(allowed_);
    ++result_.grammar_exact_steps;
    return session_.rescore(row, allowed_);
  }
  if (constraint_->apply(scores) > 0) return scores;
  ++result_.grammar_dense_steps;
  TokenScores dense = session_.rescore(row, {});
  constraint_->apply(dense);
  return dense;
}

TokenScores Generation::with_raised_tokens(TokenScores scores, size_t row) {
  if (scores.ids.empty()) return scores;
  const auto& bias = options_.logit_bias;
  bias_seen_.assign(bias.size(), 0);
  for (const TokenId id : scores.ids) {
    if (const auto* b = find_bias(bias, id)) bias_seen_[static_cast<size_t>(b - bias.data())] = 1;
  }
  size_t missing = 0;
  for (size_t k = 0; k < bias.size(); ++k) missing += bias[k].second > 0.0f && !bias_seen_[k];
  if (missing == 0) return scores;
  raised_.assign(scores.ids.begin(), scores.ids.end());
  for (size_t k = 0; k < bias.size(); ++k) {
    if (bias[k].second > 0.0f && !bias_seen_[k]) raised_.push_back(bias[k].first);
  }
  return session_.rescore(row, raised_);
}

void Generation::apply_logit_bias(TokenScores scores) const {
  const auto& bias = options_.logit_bias;  // ids ascending
  if (scores.ids.empty()) {
    for (const auto& [token, b] : bias) {
      if (static_cast<size_t>(token) < scores.size()) scores.logits[static_cast<size_t>(token)] += b;
    }
    return;
  }
  for (size_t i = 0; i < scores.size(); ++i) {
    if (const auto* b = find_bias(bias, scores.ids[i])) scores.logits[i] += b->second;
  }
}

TokenScores Generation::prepare(TokenScores scores, size_t row) {
  const size_t i = result_.tokens.size();
  if (!options_.logit_bias.empty()) scores = with_raised_tokens(scores, row);
  if (constraint_) scores = constrain(scores, row);
  if (!options_.logit_bias.empty()) apply_logit_bias(scores);
  if (options_.top_logprobs >= 0) {
    raw_logits_.assign(scores.logits.begin(), scores.logits.end());
    raw_ids_.assign(scores.ids.begin(), scores.ids.end());
  }
  // (A grammar already decides where the answer may end.)
  if (i < options_.min_tokens && !options_.ignore_eos && !constraint_) suppress_stop_tokens(scores);
  return scores;
}

void Generation::sample(TokenScores scores, size_t row) {
  scores = prepare(scores, row);
  commit(sampler_.sample(scores, history_), row);
}

void Generation::commit(TokenId token, size_t row) {
  const size_t i = result_.tokens.size();
  if (constraint_ && !constraint_->accept(token)) {
    throw Error("the grammar refused token " + std::to_string(token) + ", which its own mask allowed");
  }
  if (i == 0) {
    t_first_ = Clock::now();
    result_.ttft_ms = ms_between(t0_, t_first_);
  }
  result_.tokens.push_back(token);
  history_.push_back(token);
  last_ = token;
  last_row_ = row;
  done_ = true;  // unless it goes on below
  if (options_.top_logprobs >= 0) {
    result_.logprobs.push_back(compute_logprobs(raw_logits_, raw_ids_, token, static_cast<size_t>(options_.top_logprobs)));
  }
  if (options_.on_token && !options_.on_token(token, options_.top_logprobs >= 0 ? &result_.logprobs.back() : nullptr)) {
    stopped_by_client_ = true;
    return;
  }
  const auto& stop_tokens = session_.engine().stop_tokens();
  const bool is_stop_token =
      std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end() ||
      std::find(options_.stop_token_ids.begin(), options_.stop_token_ids.end(), token) != options_.stop_token_ids.end();
  if (is_stop_token && (!options_.ignore_eos || constraint_)) {
    result_.finish_reason = "stop";
    return;
  }
  result_.text += decoder_.push(token);
  bool stop_string = false;
  for (const auto& stop : options_.stop) {
    if (stop.empty()) continue;
    const size_t from = emitted_ > stop.size() ? emitted_ - stop.size() : 0;
    const size_t at = result_.text.find(stop, from);
    if (at != std::string::npos) {
      result_.text.resize(at);
      stop_string = true;
    }
  }
  if (stop_string) {
    result_.finish_reason = "stop";
    return;
  }
  emit(result_.text.size() - held_back(result_.text, options_.stop));
  if (stopped_by_client_) return;
  if (i + 1 == options_.max_tokens || session_.cache().n_past >= session_.engine().n_ctx()) return;
  done_ = false;
}

GenerateResult Generation::finish() {
  if (result_.finish_reason == "length") result_.text += decoder_.flush();
  if (!stopped_by_client_) emit(result_.text.size());
  result_.cancelled = stopped_by_client_;
  const size_t n = result_.tokens.size();
  const size_t prefilled = prompt_.size() - result_.cached_tokens;
  const double prefill_ms = n > 0 ? result_.ttft_ms : prefill_ms_;
  result_.prefill_tok_s = prefill_ms > 0 ? 1000.0 * static_cast<double>(prefilled) / prefill_ms : 0;
  const double decode_ms = n > 0 ? ms_between(t_first_, Clock::now()) : 0;
  result_.decode_tok_s = n > 1 && decode_ms > 0 ? 1000.0 * static_cast<double>(n - 1) / decode_ms : 0;
  done_ = true;
  return std::move(result_);
}

}  // namespace kestrel::runtime
