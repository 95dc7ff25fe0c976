// Drafting with Gemma 4's MTP assistant (model/mtp_assistant.h) for one generation: `--draft
// auto` on an image that carries one (docs/speculative.md, "Gemma 4 MTP assistant").
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "kestrel/model/mtp_assistant.h"
#include "kestrel/runtime/sampler.h"

namespace kestrel::runtime {

class Session;

/// The assistant's greedy drafts from the target's state, with the n-gram drafter's length
/// policy: the length starts at 2, doubles (up to max_draft) after a draft accepted whole and
/// becomes one more than the accepted count after a partial one; a draft of which nothing was
/// accepted pauses drafting for 1, 2, 4 ... kMaxPause steps (doubling with each in a row), so an
/// assistant that never hits costs about one verification row per kMaxPause steps.
class MtpDrafter {
 public:
  static constexpr size_t kMaxPause = 64;

  /// `target`: the generation's session (its cache and scored rows are the assistant's input);
  /// both must outlive the drafter.
  MtpDrafter(const model::MtpAssistant& assistant, Session& target, size_t max_draft)
      : assistant_(&assistant), target_(&target), max_draft_(max_draft) {}

  /// Up to min(limit, current length) drafts after `last` (the token just sampled, not yet in
  /// the target's cache) from `target_hidden`, float32 [d_model]: the target's final hidden
  /// state of the row that sampled `last` (Session::scored_hidden). Empty while paused (each
  /// such call counts one step), for an empty `target_hidden`, or when the assistant cannot read
  /// the cache (a sliding ring that lost its window after a long rollback).
  std::vector<TokenId> draft(TokenId last, std::span<const float> target_hidden, size_t limit);
  /// Feedback after a verification: `accepted` of `drafted` tokens were the model's own.
  void verified(size_t drafted, size_t accepted);

 private:
  const model::MtpAssistant* assistant_;
  Session* target_;
  size_t max_draft_;
  size_t length_ = 2;
  size_t pause_ = 0;       // steps left without drafting
  size_t next_pause_ = 1;  // the pause after the next draft of which nothing is accepted
};

}  // namespace kestrel::runtime
