// A draft model for speculative decoding (`--draft IMAGE`): a smaller model with the target's
// vocabulary proposes the next tokens, one decode step of its own per token.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include "kestrel/runtime/drafter.h"
#include "kestrel/runtime/sampler.h"

namespace kestrel::runtime {

class Session;

/// Drafts with a Session on the draft model (Session::draft_session), which keeps a KV cache
/// of the same sequence: before each draft the cache is cut back to its longest prefix that
/// the sequence still has (KvCache::truncate: the rejected draft tokens go) and the tokens it
/// lacks are fed in one step (the verified tokens; the whole prompt on the first draft, or
/// after the sequence ran in a batch without drafting), then each draft token is a one-token
/// step. The length adapts and backs off as DraftLength says.
///
/// Deterministic drafts (DraftRequest::sample false) are the draft model's most likely tokens
/// after the generation's penalties (greedy decoding's choice on the draft model). Sampled
/// drafts (DraftAccept::kDistribution at temperature > 0) are drawn from q: the draft model's
/// distribution after the generation's whole sampling chain (penalties, top-k/top-p/min-p,
/// temperature), with a generator of the drafter's own (seeded from the sampler's seed), so
/// the target's random draws are not consumed by drafting.
class ModelDrafter : public Drafter {
 public:
  /// `session` (a Session on the draft model) must outlive the drafter.
  ModelDrafter(Session& session, size_t max_draft, const SamplerConfig& sampler);

  Draft draft(const DraftRequest& request) override;
  void verified(size_t drafted, size_t accepted) override { length_.verified(drafted, accepted); }

 private:
  Session& session_;
  DraftLength length_;
  Sampler sampling_;  // the generation's chain, for q
  Sampler greedy_;    // the same penalties at temperature 0, for deterministic drafts
  bool penalties_;    // the chain penalizes repeats (greedy drafts then follow the penalized scores)
  std::mt19937_64 rng_;
  std::vector<TokenId> context_;  // history and the tokens drafted so far (for the penalties)
};

}  // namespace kestrel::runtime
