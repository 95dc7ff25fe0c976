#include "kestrel/runtime/session_pool.h"

#include <algorithm>
#include <new>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/model/model.h"

namespace kestrel::runtime {

size_t session_bytes(Engine& engine) {
  const model::ModelInfo& info = engine.model().info();
  return engine.session().cache().bytes() + engine.n_ctx() * sizeof(TokenId) +
         (info.n_vocab + info.d_model) * sizeof(float);
}

void check_parallel_memory(size_t n_sessions, size_t per_session, size_t n_ctx, size_t available) {
  // The first session is the engine's own, allocated with the weights.
  const size_t more = n_sessions - 1;
  if (more == 0 || per_session == 0 || more <= available / per_session) return;
  const size_t fits = 1 + available / per_session;
  throw Error("--parallel " + std::to_string(n_sessions) + " needs " + std::to_string(more) + " more sessions of " +
              model::format_bytes(per_session) + " each (a KV cache of " + std::to_string(n_ctx) +
              " positions), " + model::format_bytes(more * per_session) + ", but only " +
              model::format_bytes(available) + " of memory is available with the model loaded (MemAvailable); " +
              (fits > 1 ? "lower --parallel to at most " + std::to_string(fits) + ", or --ctx"
                        : "lower --parallel to 1, or --ctx"));
}

SessionPool::SessionPool(Engine& engine, size_t n_sessions) {
  if (n_sessions == 0) throw Error("--parallel must be at least 1");
  const size_t one = session_bytes(engine);
  check_parallel_memory(n_sessions, one, engine.n_ctx(), model::available_memory());
  sessions_.push_back(&engine.session());
  try {
    for (size_t i = 1; i < n_sessions; ++i) {
      owned_.push_back(std::make_unique<Session>(engine));
      sessions_.push_back(owned_.back().get());
    }
  } catch (const std::bad_alloc&) {
    // The memory went elsewhere meanwhile, or a limit (ulimit -v, a cgroup) is below it.
    throw Error("out of memory allocating session " + std::to_string(sessions_.size() + 1) + " of --parallel " +
                std::to_string(n_sessions) + " (" + model::format_bytes(one) + " each, a KV cache of " +
                std::to_string(engine.n_ctx()) + " positions); lower --parallel or --ctx");
  }
  last_used_.assign(n_sessions, 0);
  busy_.assign(n_sessions, false);
}

SessionPool::Pick SessionPool::acquire(std::span<const TokenId> prompt, bool cache_prompt) {
  size_t best = sessions_.size(), best_reuse = 0;
  for (size_t i = 0; i < sessions_.size(); ++i) {
    if (busy_[i]) continue;
    size_t reuse = cache_prompt ? sessions_[i]->reusable_prefix(prompt) : 0;
    // The test below weighs the whole shared prefix (reuse leaves the prompt's last rows to
    // prefill, which a short prompt's share must not be judged by).
    const size_t shared = cache_prompt ? model::common_prefix(sessions_[i]->cached_tokens(), prompt) : 0;
    // A prefix that is neither half of the session's cache nor half of the prompt (the start of
    // a chat template, a shared first word) is not worth another conversation's cache: such a
    // session competes only by age. (llama-server's --slot-prompt-similarity plays this part.)
    // Half of the prompt counts: a regenerated answer or an edited last message shares the
    // conversation's prompt, though the cache also holds the answer being replaced.
    if (2 * shared < sessions_[i]->cached_tokens().size() && 2 * shared < prompt.size()) reuse = 0;
    if (best == sessions_.size() || reuse > best_reuse ||
        (reuse == best_reuse && last_used_[i] < last_used_[best])) {
      best = i;
      best_reuse = reuse;
    }
  }
  if (best == sessions_.size()) return {};
  last_used_[best] = ++clock_;
  busy_[best] = true;
  return {sessions_[best], best_reuse};
}

void SessionPool::release(Session* session) {
  for (size_t i = 0; i < sessions_.size(); ++i) {
    if (sessions_[i] == session) busy_[i] = false;
  }
}

size_t SessionPool::n_free() const { return static_cast<size_t>(std::count(busy_.begin(), busy_.end(), false)); }

size_t SessionPool::kv_bytes() const {
  size_t total = 0;
  for (const auto* s : sessions_) total += s->cache().bytes();
  return total;
}

}  // namespace kestrel::runtime
