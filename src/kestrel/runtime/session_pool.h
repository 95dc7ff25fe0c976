// Several Sessions on one Engine, each keeping the KV cache of the last request it ran, and the
// choice of the session a request runs in (the server's prompt cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kestrel/runtime/engine.h"

namespace kestrel::runtime {

class SessionPool {
 public:
  /// `n_sessions` sessions (>= 1): the engine's default one and n_sessions - 1 more. Throws
  /// kestrel::Error, naming --parallel, when the new sessions need more than the memory available
  /// now (check_parallel_memory with model::available_memory(), the weights being loaded), or
  /// when allocating them fails all the same (std::bad_alloc).
  SessionPool(Engine& engine, size_t n_sessions);

  struct Pick {
    Session* session = nullptr;  // null when every session is busy
    size_t reusable = 0;         // prompt tokens its cache can supply, as counted below
  };
  /// The session for `prompt`: with `cache_prompt`, the one whose cache shares the longest
  /// exactly reusable prefix with it, counting only prefixes that keep at least half of that
  /// session's cache or cover at least half of the prompt (a chat template's first tokens do
  /// not evict another conversation; a regenerated answer reuses its prompt); else,
  /// and without `cache_prompt`, the least recently used, so that other conversations keep
  /// their caches. `reusable` is the chosen session's prefix as counted here (0 when it won by
  /// age). Only free sessions are considered; the one picked is busy until release(). Not
  /// thread-safe.
  Pick acquire(std::span<const TokenId> prompt, bool cache_prompt);
  void release(Session* session);
  size_t n_free() const;

  size_t size() const { return sessions_.size(); }
  /// KV cache bytes of all sessions.
  size_t kv_bytes() const;

 private:
  std::vector<Session*> sessions_;
  std::vector<std::unique_ptr<Session>> owned_;
  std::vector<uint64_t> last_used_;
  std::vector<bool> busy_;
  uint64_t clock_ = 0;
};

/// Bytes one more Session of `engine` allocates: its KV cache, the token ids it records, the
/// step buffers.
size_t session_bytes(Engine& engine);

/// Throws kestrel::Error when the n_sessions - 1 sessions to allocate, `per_session` bytes each
/// (a KV cache of n_ctx positions), need more than `available` bytes; the message names
/// --parallel, both amounts, and the --parallel that fits (or --ctx to lower).
void check_parallel_memory(size_t n_sessions, size_t per_session, size_t n_ctx, size_t available);

}  // namespace kestrel::runtime
