#include "kestrel/runtime/drafter.h"

#include <algorithm>

#include "kestrel/base/error.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::runtime {

static_assert(kMaxDraft + 1 < kernels::kTileMinTokens, "a verification must stay on the decode kernels");

DraftMode parse_draft_mode(const std::string& name) {
  if (name == "none") return DraftMode::kNone;
  if (name == "ngram") return DraftMode::kNgram;
  if (name == "auto") return DraftMode::kAuto;
  if (name.empty()) throw Error("--draft '': expected none, ngram, auto or a draft model image");
  return DraftMode::kModel;
}

DraftAccept parse_draft_accept(const std::string& name) {
  if (name == "exact") return DraftAccept::kExact;
  if (name == "distribution") return DraftAccept::kDistribution;
  throw Error("--draft-accept '" + name + "': expected exact or distribution");
}

const char* draft_accept_name(DraftAccept accept) {
  return accept == DraftAccept::kExact ? "exact" : "distribution";
}

size_t DraftLength::next(size_t limit) {
  limit = std::min(limit, length_);
  if (limit == 0) return 0;
  if (pause_ > 0) {
    --pause_;
    return 0;
  }
  return limit;
}

void DraftLength::verified(size_t drafted, size_t accepted) {
  if (drafted == 0) return;
  rate_ = (1 - kRateWeight) * rate_ + kRateWeight * static_cast<double>(accepted) / static_cast<double>(drafted);
  if (accepted == drafted) {
    length_ = std::min(max_draft_, 2 * length_);
    next_pause_ = 1;
  } else if (accepted > 0 && rate_ >= kMinRate) {
    length_ = std::max<size_t>(1, accepted + 1);
    next_pause_ = 1;
  } else {
    length_ = std::max<size_t>(1, length_ / 2);
    pause_ = next_pause_;
    next_pause_ = std::min(kMaxPause, 2 * next_pause_);
  }
}

std::vector<TokenId> NgramDrafter::draft(std::span<const TokenId> history, size_t limit) {
  limit = length_.next(limit);
  if (limit == 0) return {};
  const size_t n_hist = history.size();
  for (size_t n = std::min(kMaxNgram, n_hist > 0 ? n_hist - 1 : 0); n >= kMinNgram; --n) {
    const auto suffix = history.subspan(n_hist - n);
    // The most recent earlier occurrence: start positions from n_hist - n - 1 down to 0.
    for (size_t start = n_hist - n; start-- > 0;) {
      if (!std::equal(suffix.begin(), suffix.end(), history.begin() + static_cast<std::ptrdiff_t>(start))) continue;
      const size_t from = start + n, to = std::min(n_hist, from + limit);
      return {history.begin() + static_cast<std::ptrdiff_t>(from), history.begin() + static_cast<std::ptrdiff_t>(to)};
    }
  }
  return {};
}

}  // namespace kestrel::runtime
