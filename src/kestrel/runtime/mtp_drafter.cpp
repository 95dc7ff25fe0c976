#include "kestrel/runtime/mtp_drafter.h"

#include <algorithm>

#include "kestrel/base/error.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/session.h"

namespace kestrel::runtime {

Draft MtpDrafter::draft(const DraftRequest& request) {
  if (request.history.empty()) return {};
  const size_t n = length_.next(request.limit);
  if (n == 0 || request.target_hidden.size() != assistant_->config().d_backbone) return {};
  try {
    return {assistant_->draft(request.history.back(), request.target_hidden.data(), target_->cache(), n,
                              target_->engine().pool()),
            {}};
  } catch (const Error&) {
    return {};  // the cache no longer holds what the assistant reads: no draft this step
  }
}

}  // namespace kestrel::runtime
