// kestrel flashhead-eval: FlashHead against the dense head, teacher-forced on a text, for a
// sweep of probe counts (the curve for choosing --probes).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "option_checks.h"
#include "kestrel/base/error.h"
#include "kestrel/runtime/calibration.h"
#include "kestrel/runtime/flashhead_eval.h"

namespace kestrel::tools {
namespace {

struct FlashHeadEvalCliOptions {
  ModelOptions model;
  std::string file;
  std::string probes;  // comma-separated
  size_t skip_chars = 0;
  size_t max_chars = 200000;
  size_t positions = 4096;
  size_t ctx = 512;
  bool json = false;
  runtime::SamplerConfig sampler;
  double top_p_cover = 0.95;
};

std::vector<size_t> parse_list(const std::string& s) {
  std::vector<size_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) throw Error("an empty entry in '" + s + "'");
    size_t used = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v == 0 || item[0] == '-') throw Error("'" + item + "' is not a positive integer");
    out.push_back(static_cast<size_t>(v));
  }
  return out;
}

int run(const FlashHeadEvalCliOptions& o) {
  ModelOptions m = o.model;
  m.ctx = 1;  // the evaluation makes its own cache
  m.head = "flash";
  runtime::Engine engine = m.load();
  // (a pipe or FIFO reads to its end as a file does; "-" is standard input)
  const std::string all = runtime::calibration_text(o.file == "-" ? "/dev/stdin" : o.file, o.skip_chars + o.max_chars);
  if (all.size() <= o.skip_chars) throw Error(o.file + " has no text after the first " + std::to_string(o.skip_chars) + " characters");
  const auto tokens = engine.encode(std::string_view(all).substr(o.skip_chars), false);
  runtime::FlashHeadEvalOptions options;
  options.probes = parse_list(o.probes);
  options.n_ctx = o.ctx;
  options.max_positions = o.positions;
  options.sampler = o.sampler;
  options.top_p_cover = o.top_p_cover;
  const bool tty = isatty(fileno(stderr)) != 0;
  const auto r = runtime::evaluate_flashhead(engine, tokens, options, [&](size_t done, size_t total) {
    if (!o.json && tty) std::fprintf(stderr, "\r%zu/%zu positions", done, total);
  });
  if (!o.json && tty) std::fprintf(stderr, "\n");
  const auto* flash = engine.flashhead();
  if (o.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : r.rows) {
      rows.push_back({{"probes", row.probes}, {"candidates", row.candidates}, {"same_top1_pct", row.same_top1_pct},
                      {"recall_pct", row.recall_pct}, {"head_ms", row.head_ms},
                      {"speedup_vs_dense", row.head_ms > 0 ? r.dense_head_ms / row.head_ms : 0.0},
                      {"mean_tv", row.mean_tv}, {"max_tv", row.max_tv}, {"mean_probes", row.mean_probes},
                      {"extra_probes_pct", row.extra_probes_pct}, {"dense_fallback_pct", row.dense_pct},
                      {"unproven_pct", row.unproven_pct}, {"top_p_cover_pct", row.top_p_cover_pct},
                      {"missed_mass", row.missed_mass}, {"max_missed_mass", row.max_missed_mass},
                      {"sampler_cover_pct", row.sampler_cover_pct}});
    }
    std::cout << nlohmann::json{{"positions", r.positions}, {"n_clusters", flash->n_clusters()},
                                {"cluster_size", flash->cluster_size()}, {"dense_head_ms", r.dense_head_ms},
                                {"threads", engine.pool().size()}, {"proof", flash->proof_status()},
                                {"top_p_cover", r.top_p}, {"mean_nucleus", r.mean_nucleus},
                                {"max_nucleus", r.max_nucleus}, {"rows", rows}}.dump()
              << "\n";
    return 0;
  }
  std::printf("%zu positions, %zu clusters of %zu, %d threads; dense head %.3f ms per position (median)\n",
              r.positions, flash->n_clusters(), flash->cluster_size(), engine.pool().size(), r.dense_head_ms);
  std::printf("greedy proof: %s\n", flash->proof_status().c_str());
  if (r.top_p > 0) {
    std::printf("top-p %g nucleus of the dense softmax (temperature 1): %.1f tokens on average, %zu at most\n",
                r.top_p, r.mean_nucleus, r.max_nucleus);
  }
  std::printf("%8s %11s %11s %9s %9s %8s %9s %8s %11s %7s %7s %9s %10s %10s %11s\n", "probes", "candidates",
              "same-top1%", "recall%", "head ms", "speedup", "mean TV", "max TV", "mean-probes", "extra%", "dense%",
              "top-p%", "missed", "max-missed", "sampler%");
  for (const auto& row : r.rows) {
    std::printf("%8zu %11.0f %11.3f %9.3f %9.3f %7.2fx %9.4f %8.4f %11.1f %7.2f %7.2f %9.3f %10.2e %10.2e %11.3f\n",
                row.probes, row.candidates, row.same_top1_pct, row.recall_pct, row.head_ms,
                row.head_ms > 0 ? r.dense_head_ms / row.head_ms : 0.0, row.mean_tv, row.max_tv, row.mean_probes,
                row.extra_probes_pct, row.dense_pct, row.top_p_cover_pct, row.missed_mass, row.max_missed_mass,
                row.sampler_cover_pct);
  }
  return 0;
}

}  // namespace

Command add_flashhead_eval_command(CLI::App& app) {
  auto o = std::make_shared<FlashHeadEvalCliOptions>();
  auto* cmd = app.add_subcommand("flashhead-eval",
                                 "FlashHead against the dense head on a text: same top-1, recall, head time, "
                                 "sampling distance, top-p coverage, per probe count");
  cmd->add_option("-m,--model", o->model.model, "Kestrel image built with --flashhead")->required();
  cmd->add_option("-t,--threads", o->model.threads, "Threads (default: every core)")
      ->check(integer_range(0, ThreadPool::kMaxThreads));
  cmd->add_option("-f,--file", o->file, "Text file, or OpenAssistant .jsonl (its rows' text); -: standard input")->required();
  cmd->add_option("--probes", o->probes, "Comma-separated probe counts (default: the image's)")
      ->check(CLI::Validator(
          [](const std::string& text) {
            try {
              parse_list(text);
            } catch (const std::exception& e) {
              return std::string(e.what());
            }
            return std::string();
          },
          "LIST"));
  cmd->add_option("--skip-chars", o->skip_chars, "Skip this many characters of the text first (held-out data)")
      ->check(integer_range(size_t{0}, size_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--max-chars", o->max_chars, "Characters of text to read at most")
      ->check(integer_range(size_t{1}, size_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--positions", o->positions, "Positions to score at most")
      ->check(integer_range(size_t{1}, size_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--eval-ctx", o->ctx, "Tokens per chunk (each from an empty cache)")
      ->check(integer_range(size_t{2}, size_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--temp", o->sampler.temperature, "Sampling temperature compared (0: skip the TV distance)")
      ->check(number_range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--top-k", o->sampler.top_k, "Top-k of the compared sampler")
      ->check(integer_range(0, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--top-p", o->sampler.top_p, "Top-p of the compared sampler")->check(number_range(0.0, 1.0))->capture_default_str();
  cmd->add_option("--min-p", o->sampler.min_p, "Min-p of the compared sampler")->check(number_range(0.0, 1.0))->capture_default_str();
  cmd->add_option("--top-p-cover", o->top_p_cover,
                  "p of the dense top-p nucleus (temperature 1) whose coverage by the candidates is measured "
                  "(0: skip)")
      ->check(number_range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON object");
  return [o] { return run(*o); };
}

}  // namespace kestrel::tools
