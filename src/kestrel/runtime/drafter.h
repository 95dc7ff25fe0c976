// Drafting for speculative decoding: tokens proposed cheaply, then verified by the model in one
// forward pass (Generation::advance_rows), which keeps the longest prefix the model itself
// would have produced.
#pragma once

#include <cstddef>
#include <span>
#include <string>
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
  kAuto,   // the image's own drafter when it has one (none has yet), else kNgram
};

/// Parses "none", "ngram" or "auto". Throws kestrel::Error naming the accepted values.
DraftMode parse_draft_mode(const std::string& name);

/// Prompt-lookup drafting (the n-gram / prompt-lookup decoding of llama.cpp's `ngram` modes and
/// vLLM's `ngram` method, after Saxena 2023): the tokens that followed the most recent earlier
/// occurrence of the sequence's last n tokens, n from kMaxNgram down to kMinNgram. No model is
/// run: it pays off where the text repeats itself (code edits, tables, JSON, quotations).
///
/// Adaptive: the draft length starts at 2, doubles (up to max_draft) after a draft that was
/// accepted whole and shrinks to one more than the accepted count otherwise. A draft of which
/// nothing was accepted, or any partly accepted one while the acceptance rate (an exponential
/// average over drafts, weight kRateWeight for the newest) is under kMinRate, pauses drafting
/// for a number of steps that doubles with each such draft in a row (1, 2, 4, ... kMaxPause):
/// a verification row costs about half a decode step on the development machine
/// (docs/speculative.md), so drafts accepted less than half the time do not pay, and text that
/// does not repeat itself costs about one verification row per kMaxPause steps.
class NgramDrafter {
 public:
  static constexpr size_t kMinNgram = 2;
  static constexpr size_t kMaxNgram = 4;
  static constexpr size_t kMaxPause = 64;
  static constexpr double kMinRate = 0.5;
  static constexpr double kRateWeight = 0.25;

  explicit NgramDrafter(size_t max_draft) : max_draft_(max_draft) {}

  /// Up to min(limit, current draft length) tokens to try after `history` (the prompt and the
  /// tokens generated so far, the last sampled one included); empty when none matches or while
  /// paused (each call while paused counts one step).
  std::vector<TokenId> draft(std::span<const TokenId> history, size_t limit);
  /// Feedback after a verification: `accepted` of `drafted` tokens were the model's own.
  void verified(size_t drafted, size_t accepted);

 private:
  size_t max_draft_;
  size_t length_ = 2;
  size_t pause_ = 0;        // steps left without drafting
  size_t next_pause_ = 1;   // the pause after the next draft that fails
  double rate_ = 1.0;       // acceptance rate, exponential average over drafts
};

}  // namespace kestrel::runtime
