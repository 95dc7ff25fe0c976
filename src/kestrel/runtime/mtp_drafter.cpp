#include "kestrel/runtime/mtp_drafter.h"

#include <algorithm>

#include "kestrel/base/error.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/session.h"

namespace kestrel::runtime {

std::vector<TokenId> MtpDrafter::draft(TokenId last, std::span<const float> target_hidden, size_t limit) {
  if (limit == 0) return {};
  if (pause_ > 0) {
    --pause_;
    return {};
  }
  if (target_hidden.size() != assistant_->config().d_backbone) return {};
  const size_t n = std::min({length_, max_draft_, limit});
  try {
    return assistant_->draft(last, target_hidden.data(), target_->cache(), n, target_->engine().pool());
  } catch (const Error&) {
    return {};  // the cache no longer holds what the assistant reads: no draft this step
  }
}

void MtpDrafter::verified(size_t drafted, size_t accepted) {
  if (drafted == 0) return;
  if (accepted == 0) {
    pause_ = next_pause_;
    next_pause_ = std::min(2 * next_pause_, kMaxPause);
  } else {
    next_pause_ = 1;
  }
  length_ = accepted == drafted ? std::min(2 * length_, max_draft_) : accepted + 1;
}

}  // namespace kestrel::runtime
