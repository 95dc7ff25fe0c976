// The server's sequences: several Sessions on the one Engine, each keeping the KV cache of the
// last request it ran, and the choice of the session a request runs in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kestrel/runtime/engine.h"

namespace kestrel::server {

class SessionPool {
 public:
  /// `n_sessions` sessions (>= 1): the engine's default one and n_sessions - 1 more. Throws
  /// kestrel::Error, naming --parallel, when their KV caches together exceed the machine's memory.
  SessionPool(runtime::Engine& engine, size_t n_sessions);

  struct Pick {
    runtime::Session* session = nullptr;
    size_t reusable = 0;  // prompt tokens its cache can supply (Session::reuse_prefix would keep)
  };
  /// The session for `prompt`: with `cache_prompt`, the one whose cache shares the longest
  /// exactly reusable prefix with it, counting only prefixes that keep at least half of that
  /// session's cache (a chat template's first tokens do not evict another conversation); else,
  /// and without `cache_prompt`, the least recently used, so that other conversations keep
  /// their caches. `reusable` is the chosen session's prefix as counted here (0 when it won by
  /// age). Not thread-safe: call it with the engine held.
  Pick pick(std::span<const runtime::TokenId> prompt, bool cache_prompt);

  size_t size() const { return sessions_.size(); }
  /// KV cache bytes of all sessions.
  size_t kv_bytes() const;

 private:
  std::vector<runtime::Session*> sessions_;
  std::vector<std::unique_ptr<runtime::Session>> owned_;
  std::vector<uint64_t> last_used_;
  uint64_t clock_ = 0;
};

}  // namespace kestrel::server
