// kestrel perplexity: llama-perplexity's measurement of a model on a text file, optionally with
// the KL divergence from a base model.
#include <cstdio>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "option_checks.h"
#include "kestrel/base/error.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/runtime/kernels_report.h"
#include "kestrel/runtime/model_path.h"
#include "kestrel/runtime/perplexity.h"

namespace kestrel::tools {
namespace {

struct PerplexityCliOptions {
  std::string model;
  std::string base;
  std::string file;
  int threads = 0;
  size_t ctx = 512;
  size_t chunks = 0;
  size_t ubatch = 64;
  std::string decode_act = "auto";
  std::string base_decode_act = "auto";
  std::string base_precision = "source";
  std::string cache_type_k = "f16", cache_type_v = "f16";  // the model's; --kl-base keeps f16
  std::string kernels;  // --kernels: both models' (kernels/kernel_options.h)
  bool no_image_cache = false;  // --no-image-cache (runtime/image_cache.h)
  bool json = false;
};

// "1 chunk", "2 chunks".
std::string count(size_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

// The engines' own caches are not used (perplexity makes one per model at --ctx), so they are
// loaded with the smallest context; --ctx is checked against the model's maximum afterwards.
ModelOptions model_options(const PerplexityCliOptions& o) {
  ModelOptions m;
  m.kernels = o.kernels;
  m.model = o.model;
  m.threads = o.threads;
  m.ctx = 1;
  m.decode_act = o.decode_act;
  m.cache_type_k = o.cache_type_k;
  m.cache_type_v = o.cache_type_v;
  m.no_image_cache = o.no_image_cache;
  return m;
}

int run_perplexity(const PerplexityCliOptions& o) {
  if (o.ctx < 4) throw Error("--ctx must be at least 4 (got " + std::to_string(o.ctx) + ")");
  const std::string text = read_input_file(o.file);
  const ModelOptions model = model_options(o);
  runtime::Engine engine = model.load();
  std::optional<runtime::Engine> base;
  if (!o.base.empty()) {
    runtime::EngineOptions base_options;
    base_options.n_threads = o.threads;
    base_options.n_ctx = 1;
    base_options.load.decode_activations = kernels::parse_decode_activations(o.base_decode_act);
    base_options.load.precision = quant::parse_precision(o.base_precision);
    base.emplace(runtime::model_path_argument(o.base), base_options);
  }
  const std::vector<runtime::TokenId> tokens = engine.encode(text, /*special=*/false);

  runtime::PerplexityOptions options;
  options.n_ctx = o.ctx;
  options.max_chunks = o.chunks;
  options.rows_per_pass = o.ubatch;
  runtime::PerplexityProgress progress;
  if (!o.json) {
    progress = [&](size_t chunk, size_t n_chunks, const runtime::PerplexityResult& r) {
      std::fprintf(stderr, "[%zu/%zu] ppl %.4f", chunk, n_chunks, r.ppl);
      if (r.has_base) std::fprintf(stderr, "  base ppl %.4f  KL %.4g", r.base_ppl, r.kl_mean);
      std::fprintf(stderr, "  (%.1f s)\n", r.seconds);
    };
  }
  const runtime::PerplexityResult r =
      base ? runtime::perplexity(engine, *base, tokens, options, progress)
           : runtime::perplexity(engine, tokens, options, progress);

  if (o.json) {
    nlohmann::json j = {{"n_ctx", r.n_ctx},         {"n_tokens", r.n_tokens},
                        {"n_chunks", r.n_chunks},   {"n_scored", r.n_scored},
                        {"ppl", r.ppl},             {"ppl_error", r.ppl_error},
                        {"seconds", r.seconds}};
    j["kernels"] = runtime::kernels_json(engine.model().info());  // the model's (-m); docs/kernels.md
    j["image_cache"] = model.image_cache;  // -m's (runtime/image_cache.h): hit, written or off
    if (r.has_base) {
      j["base_ppl"] = r.base_ppl;
      j["base_ppl_error"] = r.base_ppl_error;
      j["kl_mean"] = r.kl_mean;
      j["kl_mean_error"] = r.kl_mean_error;
      j["kl_p99"] = r.kl_p99;
      j["kl_max"] = r.kl_max;
      j["same_top1_pct"] = r.same_top1_pct;
    }
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::printf("evaluated:     %s of %s (%s in the text), %s scored\n", count(r.n_chunks, "chunk").c_str(),
              count(r.n_ctx, "token").c_str(), count(r.n_tokens, "token").c_str(),
              count(r.n_scored, "position").c_str());
  std::printf("perplexity:    %.4f +/- %.5f\n", r.ppl, r.ppl_error);
  if (r.has_base) {
    std::printf("base ppl:      %.4f +/- %.5f\n", r.base_ppl, r.base_ppl_error);
    std::printf("KL mean:       %.6g +/- %.2g\n", r.kl_mean, r.kl_mean_error);
    std::printf("KL 99%%:        %.6g\n", r.kl_p99);
    std::printf("KL max:        %.6g\n", r.kl_max);
    std::printf("same top-1:    %.3f %%\n", r.same_top1_pct);
  }
  std::printf("time:          %.1f s\n", r.seconds);
  return 0;
}

}  // namespace

Command add_perplexity_command(CLI::App& app) {
  auto opts = std::make_shared<PerplexityCliOptions>();
  auto* cmd = app.add_subcommand(
      "perplexity", "Perplexity of a model on a text file (llama-perplexity's method), optionally "
                    "with the KL divergence from a base model");
  cmd->add_option("-m,--model", opts->model,
                  "GGUF model file or Kestrel image (default: as run's -m: $KESTREL_MODEL, else Gemma 3 270M's "
                  "cached W4A16 + FlashHead image once built, else its GGUF)");
  cmd->add_option("-f,--file", opts->file, "Text file to evaluate (-: standard input)")->required();
  cmd->add_option("--kl-base", opts->base,
                  "Base model file or image ('default': the default model's GGUF, not its image): also report "
                  "KL(base || model), same top-1 and the base perplexity");
  cmd->add_option("-c,--ctx", opts->ctx, "Tokens per chunk (at least 4); the second half of each is scored")
      ->check(integer_range(size_t{4}, size_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--chunks", opts->chunks, "Chunks to evaluate at most (0: all)")
      ->check(integer_range(size_t{0}, size_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--ubatch", opts->ubatch,
                  "Scored tokens per forward pass; below 8 they take the decode kernels, as generation's "
                  "rows do (prefill's tiles round differently): the accuracy of decoding")
      ->check(integer_range(size_t{1}, size_t{4096}))
      ->capture_default_str();
  cmd->add_option("-t,--threads", opts->threads, "Threads (default: every core)")
      ->check(integer_range(0, ThreadPool::kMaxThreads))
      ->group(kModelGroup);
  // (-m loads a GGUF as run's --precision auto does, never in its float32 source form)
  add_decode_act_option(*cmd, "--decode-act", opts->decode_act, "", "")->group(kModelGroup);
  add_decode_act_option(*cmd, "--kl-base-decode-act", opts->base_decode_act, "The base model (--kl-base)",
                        "--kl-base-precision source, the default");
  cmd->add_option("--kl-base-precision", opts->base_precision,
                  "The base model (--kl-base), a GGUF: source (its exact values, float32 layers: the reference) "
                  "or auto (as -m loads a GGUF: docs/quantization.md)")
      ->check(CLI::IsMember({"source", "auto"}))
      ->capture_default_str();
  add_kernels_option(*cmd, opts->kernels)->group(kModelGroup);
  add_kv_cache_options(*cmd, opts->cache_type_k, opts->cache_type_v);  // -m's cache; --kl-base's is f16
  cmd->add_flag("--no-image-cache", opts->no_image_cache,
                "-m a GGUF: convert it at load, without its cached image (KESTREL_IMAGE_CACHE=0 does the same)")
      ->group(kModelGroup);
  cmd->add_flag("--json", opts->json, "Print one JSON object with the results");
  return [opts] { return run_perplexity(*opts); };
}

}  // namespace kestrel::tools
