// kestrel serve: the OpenAI-compatible HTTP server (cpp-httplib) around one Engine.
#pragma once

#include <cstddef>
#include <ctime>
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
  std::string model_alias;           // another name requests may use ("default" for -m default), or empty
  size_t max_body_bytes = 16u << 20; // larger bodies get 413
  size_t http_threads = 0;           // connection threads; 0: http_thread_count's default
  size_t parallel = 4;               // sessions: requests generating at once, each with a KV cache kept for reuse
  size_t prefill_chunk = 64;         // prompt tokens per step while other requests decode
  size_t max_queue = 64;             // requests admitted at once (running + waiting); more get 429
  size_t cache_ram_mib = 1024;       // the prefix cache shared by all sessions (runtime/prefix_cache.h); 0: none
  std::string cache_dir;             // where that cache keeps blocks across restarts; empty: memory only
  std::string draft = "auto";        // speculative decoding: none, ngram, auto or a draft model path (runtime/drafter.h)
  std::string draft_accept = "exact";  // exact or distribution (runtime::DraftAccept)
  size_t draft_max = 6;              // tokens drafted per verification at most (<= runtime::kMaxDraft)
  std::string log_format = "text";   // the access log's lines: text or json (access_log.h)
  bool quiet = false;                // no access log
  size_t responses_store = 1024;     // /v1/responses kept for previous_response_id (least recently used dropped)
  bool embeddings = false;           // serve /v1/embeddings (else it answers 501)
  std::string pooling = "mean";      // --pooling: mean, last or cls (runtime/pooling.h)
};

/// Every admitted request (max_queue of them, running or waiting for a session) holds a
/// connection thread until its response ends. Threads beyond those answer /health, /metrics,
/// /v1/models and the 429s while the queue is full; at least this many must be left.
inline constexpr size_t kMinSpareHttpThreads = 2;
/// Seconds an idle keep-alive connection stays open between its requests (it holds a connection
/// thread meanwhile); also the longest SIGINT/SIGTERM waits for such a connection to close.
inline constexpr time_t kKeepAliveSeconds = 1;
/// The connection threads: options.http_threads, or by default max_queue + parallel + 4 (spare
/// threads for the other endpoints, 429s and idle keep-alive connections).
size_t http_thread_count(const ServerOptions& options);

/// Loads the model; called once, after the socket listens (GET /health answers 503 meanwhile).
using EngineLoader = std::function<std::unique_ptr<runtime::Engine>()>;

/// Binds host:port, serves, loads the engine, and serves until SIGINT or SIGTERM. Up to
/// options.parallel requests generate together (continuous batching, runtime::Scheduler), each
/// in the session whose KV cache shares the longest prefix with its prompt; more wait (FIFO). Prints "kestrel serve: listening on
/// http://HOST:PORT" and, once loaded, "kestrel serve: ready" on stderr.
/// Returns 0 after a signal. Throws kestrel::Error when the address cannot be bound or the
/// connection threads do not exceed max_queue by kMinSpareHttpThreads, and rethrows the loader's
/// exception (after closing the socket) when the model fails to load.
int serve(const ServerOptions& options, const EngineLoader& load);

}  // namespace kestrel::server
