// kestrel serve: the OpenAI-compatible HTTP server.
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "commands.h"
#include "common.h"
#include "option_checks.h"
#include "kestrel/runtime/drafter.h"
#include "kestrel/runtime/model_path.h"
#include "kestrel/server/server.h"

namespace kestrel::tools {
namespace {

struct ServeOptions {
  ModelOptions model;
  server::ServerOptions server;
  size_t max_body_mib = 16;
};

int serve(ServeOptions& o) {
  const std::filesystem::path path = o.model.resolve().path;
  if (o.server.model_id.empty()) o.server.model_id = path.stem().string();
  // Served with -m default (or no -m): requests may name it "default" too.
  if (o.model.model.empty() || o.model.model == "default") o.server.model_alias = "default";
  if (o.server.api_key.empty()) {
    if (const char* key = std::getenv("KESTREL_API_KEY")) o.server.api_key = key;
  }
  o.server.max_body_bytes = o.max_body_mib << 20;
  const ModelOptions model = o.model;
  o.server.draft = draft_model_argument(o.server.draft, path, o.model.precision == "auto");  // /props names the file
  const std::string draft = o.server.draft;
  // A draft model of another vocabulary fails here, before the port is bound and "listening"
  // is printed (the full check runs again when the models load).
  if (runtime::parse_draft_mode(draft) == runtime::DraftMode::kModel) runtime::check_draft_vocabulary(path, draft);
  return server::serve(o.server, [model, draft] {
    auto engine = model.load_unique();
    load_draft_model(*engine, draft, model);
    return engine;
  });
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  auto opts = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  opts->model.add_to(*cmd);
  auto& s = opts->server;
  cmd->add_option("--host", s.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", s.port, "Port (0: any free port)")->check(integer_range(0, 65535))->capture_default_str();
  cmd->add_option("--api-key", s.api_key, "Require 'Authorization: Bearer KEY' (default: $KESTREL_API_KEY, else none)");
  cmd->add_option("--model-name", s.model_id, "Model id for /v1/models and requests (default: the file's stem)");
  cmd->add_option("--max-body-mib", opts->max_body_mib, "Larger request bodies get 413")
      ->check(integer_range(size_t{1}, size_t{1024}))
      ->capture_default_str();
  cmd->add_option("--http-threads", s.http_threads,
                  "Connection threads (default: --queue + --parallel + 4). Each request admitted by --queue holds "
                  "one until its response ends; the others answer /health, /metrics and 429s, so at least 2 "
                  "more than --queue")
      ->check(integer_range(size_t{3}, size_t{4096}));
  cmd->add_option("--parallel", s.parallel,
                  "Sessions: requests generating together (continuous batching), each with a KV cache "
                  "kept for later requests with the same prefix (prompt cache)")
      ->check(integer_range(size_t{1}, size_t{256}))
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", s.prefill_chunk,
                  "Prompt tokens a request prefills per step while others decode (bounds their gap; "
                  "at least 8: shorter pieces would take the decode kernels and change answers)")
      ->check(integer_range(size_t{8}, size_t{256}))
      ->capture_default_str();
  cmd->add_option("--draft", s.draft,
                  "Speculative decoding while a single request is running: none, ngram (prompt lookup), "
                  "auto (the image's drafter when it has one, else ngram), default (the default model, as -m "
                  "default finds it) or IMAGE (a smaller model image or GGUF with the same vocabulary drafts). With --draft-accept exact the tokens are the same "
                  "either way")
      ->check(draft_check())
      ->capture_default_str()
      ->group(kDraftGroup);
  cmd->add_option("--draft-accept", s.draft_accept, kDraftAcceptHelp)
      ->check(CLI::IsMember({"exact", "distribution"}))
      ->capture_default_str()
      ->group(kDraftGroup);
  cmd->add_option("--draft-max", s.draft_max, "Tokens drafted per verification at most")
      ->check(integer_range(size_t{0}, runtime::kMaxDraft))
      ->capture_default_str()
      ->group(kDraftGroup);
  cmd->add_option("--cache-ram", s.cache_ram_mib,
                  "MiB of prompt prefixes' keys and values kept for every conversation to reuse (a system prompt, "
                  "a tool list, a conversation whose session went to another): least recently used first out; "
                  "0: each session reuses only its own cache")
      ->check(integer_range(size_t{0}, size_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--cache-dir", s.cache_dir,
                  "Also keep the prefix cache's blocks in DIR: those leaving memory, and all at shutdown, are "
                  "written there (checksummed) and found again after a restart; damaged files are ignored with a warning");
  cmd->add_option("--queue", s.max_queue,
                  "Requests admitted at once (running + waiting), each holding an HTTP thread (--http-threads); "
                  "more get 429")
      ->check(integer_range(size_t{1}, size_t{2048}))
      ->capture_default_str();
  cmd->add_option("--log-format", s.log_format,
                  "The access log on stderr, one line per request (method, path, status, prompt/cached/completion "
                  "tokens, ms): text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->add_flag("--quiet", s.quiet, "No access log");
  cmd->add_option("--responses-store", s.responses_store,
                  "/v1/responses kept in memory for previous_response_id (the least recently used dropped first)")
      ->check(integer_range(size_t{0}, size_t{1} << 20))
      ->capture_default_str();
  cmd->add_flag("--embeddings", s.embeddings,
                "Serve /v1/embeddings: each input's final hidden states (after the output norm) pooled and "
                "L2-normalized. A causal LM's pooled hidden states, not a trained embedding model's vectors");
  cmd->add_option("--pooling", s.pooling, "How /v1/embeddings pools a prompt's hidden states: mean, last or cls (the first token)")
      ->check(CLI::IsMember({"mean", "last", "cls"}))
      ->capture_default_str();
  cmd->callback([opts] {
    const auto& so = opts->server;
    if (so.http_threads != 0 && so.http_threads < so.max_queue + server::kMinSpareHttpThreads) {
      throw CLI::ValidationError("--http-threads " + std::to_string(so.http_threads),
                                 "must exceed --queue " + std::to_string(so.max_queue) + " by at least " +
                                     std::to_string(server::kMinSpareHttpThreads) +
                                     ": every admitted request holds a connection thread while it waits and "
                                     "streams, and /health, /metrics and 429s need threads too (raise "
                                     "--http-threads or lower --queue)");
    }
  });
  return [opts] { return serve(*opts); };
}

}  // namespace kestrel::tools
