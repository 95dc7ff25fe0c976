// What a generation is asked to do and what it reports (runtime::Session::generate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/runtime/drafter.h"
#include "kestrel/runtime/grammar.h"
#include "kestrel/runtime/logprobs.h"
#include "kestrel/runtime/pooling.h"
#include "kestrel/runtime/sampler.h"

namespace kestrel::runtime {

/// Called after each sampled token, before its text is emitted, with the token and (when
/// GenerateOptions::top_logprobs >= 0) its log-probabilities, else nullptr. Return false to
/// stop generating (a client that went away): generation ends within this decode step.
using TokenCallback = std::function<bool(TokenId, const StepLogprobs*)>;

struct GenerateOptions {
  size_t max_tokens = 256;
  SamplerConfig sampler;
  bool ignore_eos = false;         // keep going past EOS / <end_of_turn>
  std::vector<std::string> stop;   // stop strings; the text ends before the first match

  // Serving extensions (kestrel serve, the OpenAI API); the defaults change nothing.
  size_t min_tokens = 0;           // stop tokens cannot be sampled before this many tokens
  int top_logprobs = -1;           // -1: no logprobs; 0: the chosen token's; n > 0: also the n best
  bool render_special = false;     // control tokens appear in the text (Gemma 4 tool-call markers)
  std::vector<TokenId> stop_token_ids;  // more tokens that end generation, besides stop_tokens()
  /// OpenAI's logit_bias: (token, bias) pairs, ids ascending and distinct, added to the token's
  /// logit before sampling (after a grammar's mask; -100 bans a token in practice, +100 forces
  /// it). With FlashHead a token with a positive bias that is not among the candidates is
  /// scored exactly and added to them (Session::rescore), so that the bias can raise it.
  std::vector<std::pair<TokenId, float>> logit_bias;
  TokenCallback on_token;          // see TokenCallback
  /// Scheduler::run: called on the caller's thread about once a second while no token comes
  /// (waiting for a session, a long prefill); return false to cancel (a client that went away:
  /// a waiting request then never takes a session).
  std::function<bool()> on_wait;
  /// Reuse the session's cached prefix of the prompt (llama-server's cache_prompt). Off by
  /// default: a fresh sequence, as the benchmark methodology wants.
  bool cache_prompt = false;
  /// Speculative decoding (drafter.h): drafts of up to draft_max tokens, verified in one forward
  /// pass each. With draft_accept kExact the tokens are exactly those without drafting (the
  /// verification rows are computed as decode steps are, bit for bit); only the speed changes.
  /// kDistribution (speculative sampling) keeps the distribution, not the samples. draft_max is
  /// capped at kMaxDraft so that a verification stays below the kernels' tile size. kModel needs
  /// the engine's draft model (Engine::load_draft_model).
  DraftMode draft = DraftMode::kNone;
  size_t draft_max = kMaxDraft;
  DraftAccept draft_accept = DraftAccept::kExact;
  /// Structured output (grammar.h): only tokens the grammar allows are sampled, and a stop
  /// token only where the grammar may end. With FlashHead, the mask applies to the candidates;
  /// when the grammar allows at most kGrammarExactLimit tokens exactly those are scored, and
  /// when no candidate is allowed the dense head scores that step (GenerateResult counts both).
  std::shared_ptr<const CompiledGrammar> grammar;
  /// Prompt scoring (echo + logprobs, prompt_logprobs): >= 0 scores every prompt token but the
  /// first (runtime/prompt_scoring.h) with this many alternatives, from an empty cache (no
  /// prefix reuse: every position needs its row), before generating. -1: none.
  int prompt_logprobs = -1;
  /// Embeddings (runtime/pooling.h): other than kNone, the prompt is prefilled from an empty cache
  /// with every token's final hidden state (after the output norm) kept, pooled so and
  /// L2-normalized into GenerateResult::embedding; nothing is generated (max_tokens, sampling,
  /// grammar and drafting are not used).
  Pooling pooling = Pooling::kNone;
};

/// A grammar step that allows at most this many tokens scores exactly them, not the candidates.
inline constexpr size_t kGrammarExactLimit = 512;

struct GenerateResult {
  std::vector<TokenId> tokens;     // generated ids (a final stop token included)
  std::string text;                // decoded text, cut before a stop string
  std::string finish_reason;       // "stop" (stop token or string) or "length"
  size_t prompt_tokens = 0;
  size_t cached_tokens = 0;        // prompt tokens the KV cache already held (not prefilled)
  double ttft_ms = 0;              // prompt start to first token sampled
  double prefill_tok_s = 0;        // prefilled tokens (prompt_tokens - cached_tokens) / ttft, or with
                                   // max_tokens 0 (no first token) / the prefill's own time
  double decode_tok_s = 0;         // (generated - 1) / time after the first token
  std::vector<StepLogprobs> logprobs;  // one per token when top_logprobs >= 0
  bool cancelled = false;          // on_token or on_text returned false
  size_t drafted_tokens = 0;       // tokens proposed by the drafter and verified
  size_t accepted_tokens = 0;      // drafted tokens kept (DraftAccept's rule)
  size_t grammar_exact_steps = 0;  // FlashHead + grammar: steps that scored exactly the allowed tokens
  size_t grammar_dense_steps = 0;  // FlashHead + grammar: steps where no candidate was allowed (dense head)
  /// With options.prompt_logprobs >= 0: prompt token i + 1 given tokens 0..i (prompt_tokens - 1
  /// entries), and its 1-based rank in the vocabulary.
  std::vector<StepLogprobs> prompt_logprobs;
  std::vector<uint32_t> prompt_ranks;
  /// With options.pooling other than kNone: the prompt's pooled, L2-normalized hidden state,
  /// float32 [d_model].
  std::vector<float> embedding;
};

/// Called with each piece of text as soon as it is final; return false to stop generating.
using TextCallback = std::function<bool(std::string_view)>;

}  // namespace kestrel::runtime
