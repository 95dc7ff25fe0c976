#include "kestrel/runtime/draft_model.h"

#include <algorithm>

#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/session.h"
#include "kestrel/runtime/speculative_sampling.h"

namespace kestrel::runtime {
namespace {

SamplerConfig greedy(SamplerConfig c) {
  c.temperature = 0.0f;
  return c;
}

bool has_penalty(const SamplerConfig& c) {
  return c.repeat_last_n != 0 &&
         (c.repeat_penalty != 1.0f || c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f);
}

}  // namespace

ModelDrafter::ModelDrafter(Session& session, size_t max_draft, const SamplerConfig& sampler)
    : session_(session),
      length_(max_draft),
      sampling_(sampler),
      greedy_(greedy(sampler)),
      penalties_(has_penalty(sampler)),
      rng_(sampler.seed ^ 0x9E3779B97F4A7C15ull) {}

Draft ModelDrafter::draft(const DraftRequest& request) {
  const auto history = request.history;
  if (history.empty()) return {};
  // The draft model's cache will hold history and all drafted tokens but the last.
  const size_t n_ctx = session_.engine().n_ctx();
  const size_t room = n_ctx > history.size() ? n_ctx - history.size() : 0;
  const size_t k = length_.next(std::min(request.limit, room));
  if (k == 0) return {};
  model::KvCache& cache = session_.cache();
  // Keep the cached prefix the sequence still has, and always feed its last token (it scores
  // the first draft token).
  size_t keep = std::min(model::common_prefix(cache.tokens(), history), history.size() - 1);
  keep = cache.truncate(keep);
  TokenScores scores = session_.step(history.subspan(keep));

  const bool sample = request.sample && sampling_.config().temperature > 0.0f;
  context_.assign(history.begin(), history.end());
  Draft d;
  for (size_t i = 0; i < k; ++i) {
    TokenId token = 0;
    if (sample) {
      d.q.push_back(sampling_.distribution(scores, context_));
      token = draw_token(d.q.back(), rng_);
    } else {
      token = penalties_ ? greedy_.distribution(scores, context_).front().first : argmax(scores);
    }
    d.tokens.push_back(token);
    context_.push_back(token);
    if (i + 1 == k) break;
    scores = session_.step(std::span<const TokenId>(&context_.back(), 1));
  }
  return d;
}

}  // namespace kestrel::runtime
