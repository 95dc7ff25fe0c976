// kestrel serve: the OpenAI-compatible HTTP server (cpp-httplib) around one Engine.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "kestrel/runtime/engine.h"

namespace kestrel::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0: any free port (printed on stderr)
  std::string api_key;               // empty: no authentication
  std::string model_id;              // the name /v1/models lists and requests must use
  size_t max_body_bytes = 16u << 20; // larger bodies get 413
  int http_threads = 16;             // connections served at once (requests queue for the engine)
  size_t parallel = 4;               // sessions: requests generating at once, each with a KV cache kept for reuse
  size_t prefill_chunk = 64;         // prompt tokens per step while other requests decode
  size_t max_queue = 64;             // requests admitted at once (running + waiting); more get 429
};

/// Loads the model; called once, after the socket listens (GET /health answers 503 meanwhile).
using EngineLoader = std::function<std::unique_ptr<runtime::Engine>()>;

/// Binds host:port, serves, loads the engine, and serves until SIGINT or SIGTERM. Up to
/// options.parallel requests generate together (continuous batching, runtime::Scheduler), each
/// in the session whose KV cache shares the longest prefix with its prompt; more wait (FIFO). Prints "kestrel serve: listening on
/// http://HOST:PORT" and, once loaded, "kestrel serve: ready" on stderr.
/// Returns 0 after a signal. Throws kestrel::Error when the address cannot be bound, and
/// rethrows the loader's exception (after closing the socket) when the model fails to load.
int serve(const ServerOptions& options, const EngineLoader& load);

}  // namespace kestrel::server
