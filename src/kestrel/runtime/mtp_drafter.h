// Drafting with Gemma 4's MTP assistant (model/mtp_assistant.h) for one generation: `--draft
// auto` on an image that carries one (docs/speculative.md, "Gemma 4 MTP assistant").
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "kestrel/model/mtp_assistant.h"
#include "kestrel/runtime/drafter.h"
#include "kestrel/runtime/sampler.h"

namespace kestrel::runtime {

class Session;

/// The assistant's greedy drafts from the target's state (a Drafter: Generation calls it as it
/// calls the others), with the drafters' shared length policy (DraftLength: an assistant that
/// never hits costs about one verification row per DraftLength::kMaxPause steps).
class MtpDrafter : public Drafter {
 public:
  /// `target`: the generation's session (its cache is the assistant's input); both must outlive
  /// the drafter.
  MtpDrafter(const model::MtpAssistant& assistant, Session& target, size_t max_draft)
      : assistant_(&assistant), target_(&target), length_(max_draft) {}

  /// Up to min(request.limit, the current length) drafts after request.history.back() (the token
  /// just sampled, not yet in the target's cache) from request.target_hidden, float32 [d_model]:
  /// the target's final hidden state of the row that sampled it (Session::scored_hidden). Empty
  /// while paused, for a missing hidden state, or when the assistant cannot read the cache (a
  /// sliding ring that lost its window after a long rollback). Deterministic (Draft::q empty).
  Draft draft(const DraftRequest& request) override;
  void verified(size_t drafted, size_t accepted) override { length_.verified(drafted, accepted); }

 private:
  const model::MtpAssistant* assistant_;
  Session* target_;
  DraftLength length_;
};

}  // namespace kestrel::runtime
