// Drafting for speculative decoding: tokens proposed cheaply, then verified by the model in one
// forward pass (Generation::advance_rows), which keeps a prefix of them by the acceptance rule
// (DraftAccept). The drafters: prompt lookup (NgramDrafter, no model) and a smaller model with
// the same vocabulary (ModelDrafter, draft_model.h); Gemma 4's MTP assistant (MtpDrafter,
// mtp_drafter.h), which reads the target's hidden state (DraftRequest::target_hidden).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kestrel/runtime/sampler.h"

namespace kestrel::runtime {

/// The most tokens one verification drafts: with the token before them, fewer rows than
/// kernels::kTileMinTokens, where every row is computed exactly as a decode step.
inline constexpr size_t kMaxDraft = 6;

/// Which drafter a generation uses (`--draft`).
enum class DraftMode {
  kNone,   // no drafting
  kNgram,  // prompt lookup (NgramDrafter)
  kAuto,   // the image's own drafter when it has one (Gemma 4's MTP assistant: MtpDrafter), else kNgram
  kModel,  // the engine's draft model (Engine::load_draft_model; ModelDrafter)
};

/// Parses "none", "ngram" or "auto"; any other non-empty string names a draft model image
/// (kModel: the caller loads it). Throws kestrel::Error for an empty string.
DraftMode parse_draft_mode(const std::string& name);

/// How a verification decides which drafted tokens to keep (`--draft-accept`).
enum class DraftAccept {
  /// A drafted token is kept iff it is the token the sampler draws at its row, with the same
  /// random draws as decoding without a draft: the output is token for token the same as without
  /// drafting (greedy and sampled, for a given seed). The default.
  kExact,
  /// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023; speculative_sampling.h):
  /// a token x drafted from the drafter's distribution q is kept with probability
  /// min(1, p(x) / q(x)); at the first rejection the token is drawn from norm(max(0, p - q)).
  /// The output has the distribution of decoding without a draft, but other samples for a seed;
  /// it keeps more tokens of a drafter that samples its drafts (a draft model at temperature > 0).
  /// Greedy decoding accepts exactly as kExact does.
  kDistribution,
};

/// Parses "exact" or "distribution". Throws kestrel::Error naming the accepted values.
DraftAccept parse_draft_accept(const std::string& name);
const char* draft_accept_name(DraftAccept accept);

/// A probability distribution over tokens, sparse: (token, probability) pairs with positive
/// probabilities summing to 1, each token once (Sampler::distribution's form). Tokens absent
/// have probability 0.
using TokenDistribution = std::vector<std::pair<TokenId, double>>;

/// What a drafter is asked for.
struct DraftRequest {
  /// The prompt and the tokens generated so far, the last sampled one included: the draft
  /// continues after history.back().
  std::span<const TokenId> history;
  /// The most tokens to draft (room left by max_tokens and the context, and kMaxDraft).
  size_t limit = 0;
  /// True when the drafter should draw its tokens from its distribution q and return it
  /// (Draft::q): sampling with DraftAccept::kDistribution. Else it drafts deterministically
  /// (its most likely tokens).
  bool sample = false;
  /// Hook for drafters that read the target model (Gemma 4's MTP assistant): the hidden state
  /// the target's output head scored history.back() from, float32 [d_model] (after the final
  /// norm), or empty when not available (the first token after a cached prompt is always
  /// scored, so it is available during decoding). Drafters that do not need it ignore it.
  std::span<const float> target_hidden;
};

struct Draft {
  std::vector<TokenId> tokens;
  /// Empty, or one distribution per token: q[i] is the distribution tokens[i] was drawn from
  /// (given history and tokens[0..i)), with tokens[i] in its support. Empty means each token
  /// was chosen deterministically (q is the point mass on it).
  std::vector<TokenDistribution> q;
};

/// A drafter: one per generation, called once per decode step that may verify a draft.
class Drafter {
 public:
  virtual ~Drafter() = default;
  /// Up to request.limit tokens to verify after request.history; empty for no draft this step.
  virtual Draft draft(const DraftRequest& request) = 0;
  /// Feedback after a verification: `accepted` of the `drafted` tokens were kept.
  virtual void verified(size_t drafted, size_t accepted) = 0;
};

/// The draft length policy shared by the drafters: the length starts at 2, doubles (up to
/// max_draft) after a draft that was accepted whole and shrinks to one more than the accepted
/// count otherwise. A draft of which nothing was accepted, or any partly accepted one while the
/// acceptance rate (an exponential average over drafts, weight kRateWeight for the newest) is
/// under kMinRate, pauses drafting for a number of steps that doubles with each such draft in a
/// row (1, 2, 4, ... kMaxPause): a verification row costs about half a decode step on the
/// development machine (docs/speculative.md), so drafts accepted less than half the time do not
/// pay, and a drafter that never hits costs about one verification row per kMaxPause steps.
class DraftLength {
 public:
  static constexpr size_t kMaxPause = 64;
  static constexpr double kMinRate = 0.5;
  static constexpr double kRateWeight = 0.25;

  explicit DraftLength(size_t max_draft) : max_draft_(max_draft) {}
  /// The length to draft this step, at most `limit`: 0 while paused (each such call with
  /// limit > 0 counts one paused step) or when limit is 0.
  size_t next(size_t limit);
  void verified(size_t drafted, size_t accepted);
  double rate() const { return rate_; }

 private:
  size_t max_draft_;
  size_t length_ = 2;
  size_t pause_ = 0;        // steps left without drafting
  size_t next_pause_ = 1;   // the pause after the next draft that fails
  double rate_ = 1.0;       // acceptance rate, exponential average over drafts
};

/// Prompt-lookup drafting (the n-gram / prompt-lookup decoding of llama.cpp's `ngram` modes and
/// vLLM's `ngram` method, after Saxena 2023): the tokens that followed the most recent earlier
/// occurrence of the sequence's last n tokens, n from kMaxNgram down to kMinNgram. No model is
/// run: it pays off where the text repeats itself (code edits, tables, JSON, quotations). Its
/// drafts are deterministic (Draft::q empty); the length adapts as DraftLength says.
class NgramDrafter : public Drafter {
 public:
  static constexpr size_t kMinNgram = 2;
  static constexpr size_t kMaxNgram = 4;
  static constexpr size_t kMaxPause = DraftLength::kMaxPause;
  static constexpr double kMinRate = DraftLength::kMinRate;

  explicit NgramDrafter(size_t max_draft) : length_(max_draft) {}

  /// Up to min(limit, current draft length) tokens to try after `history` (the prompt and the
  /// tokens generated so far, the last sampled one included); empty when none matches or while
  /// paused (each call while paused counts one step).
  std::vector<TokenId> draft(std::span<const TokenId> history, size_t limit);
  Draft draft(const DraftRequest& request) override { return {draft(request.history, request.limit), {}}; }
  void verified(size_t drafted, size_t accepted) override { length_.verified(drafted, accepted); }

 private:
  DraftLength length_;
};

}  // namespace kestrel::runtime
