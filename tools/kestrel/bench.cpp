// kestrel bench: the model card's benchmark methodology (docs/benchmarks.md#kestrel-bench) on
// one or more models, in process; the variants table as Markdown, every figure as JSON.
#include <sys/utsname.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "kestrel/base/error.h"
#include "kestrel/image/image.h"
#include "kestrel/kernels/kernel_options.h"
#include "kestrel/runtime/bench/concurrency.h"
#include "kestrel/runtime/bench/engine_generator.h"
#include "kestrel/runtime/bench/memory.h"
#include "kestrel/runtime/bench/methodology.h"
#include "kestrel/runtime/bench/prompts.h"
#include "kestrel/runtime/bench/report.h"
#include "kestrel/runtime/bench/sensors.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/model_path.h"
#include "option_checks.h"

namespace kestrel::tools {
namespace {

namespace bench = runtime::bench;
using json = nlohmann::json;

constexpr const char* kDefaultText = "../shared/data/oasst/en-validation.jsonl";

struct BenchCliOptions {
  std::vector<std::string> models;  // PATH or LABEL=PATH; empty: the default model
  std::string suite = "all";
  std::string json_out, markdown_out, dump_prompts;
  std::vector<std::string> add_rows;
  std::string text;
  int threads = 0;
  std::optional<size_t> ctx;  // unset: 4096, or the model's maximum when smaller (runtime::EngineOptions)
  std::optional<size_t> warmup, requests, prompt_tokens, output_tokens;
  double idle_seconds = 5;
  bool no_progress = false;
  bool sensors = false;
  std::vector<size_t> concurrency;  // --concurrency: the scheduler benchmark instead of the suites
  std::string kernels;  // --kernels (kernels/kernel_options.h)
  size_t prefill_chunk = 64;
  std::string draft = "none";  // speculative decoding in the suites (off: the model card measures plain decode)
  size_t draft_max = runtime::kMaxDraft;
  std::string cache_type_k = "f16", cache_type_v = "f16";  // --cache-type-k / -v
};

struct ModelArg {
  std::string label;
  std::filesystem::path path;
};

ModelArg parse_model_arg(const std::string& arg) {
  std::error_code ec;
  const auto eq = arg.find('=');
  if (eq != std::string::npos && eq > 0 && !std::filesystem::exists(arg, ec)) {
    return {arg.substr(0, eq), arg.substr(eq + 1)};
  }
  const std::filesystem::path path = runtime::model_path_argument(arg);
  return {path.filename().string(), path};
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("cannot write " + path);
  out << text;
  out.flush();
  if (!out) throw Error("cannot write " + path);
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      std::string name = line.substr(line.find(':') + 1);
      while (!name.empty() && name.front() == ' ') name.erase(name.begin());
      return name;
    }
  }
  return "unknown";
}

json machine_json() {
  utsname u{};
  std::string os = "unknown";
  if (uname(&u) == 0) os = std::string(u.sysname) + " " + u.release + " " + u.machine;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  json m = {{"cpu", cpu_name()}, {"logical_cpus", std::thread::hardware_concurrency()}, {"os", os}};
  m["memory_bytes"] = pages > 0 && page > 0 ? json(static_cast<double>(pages) * static_cast<double>(page)) : json(nullptr);
  // The kernel switches in force (--kernels, KESTREL_KERNELS: docs/kernels.md), so A/B rows differ.
  m["kernel_switches"] = kernels::kernel_options_name(kernels::kernel_options());
  return m;
}

// "W4A16 image", "BF16 image", "GGUF Q4_K_M".
std::string precision_of(const std::filesystem::path& path) {
  const gguf::File f = gguf::File::open(path);
  if (const auto info = image::read_image_info(f)) {
    std::string name = quant::precision_name(info->precision);
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return name + " image";
  }
  const auto type = f.find_uint("general.file_type");
  if (type && *type == 15) return "GGUF Q4_K_M";
  return type ? "GGUF (file type " + std::to_string(*type) + ")" : "GGUF";
}

std::vector<bench::SuiteSpec> suites_of(const BenchCliOptions& o) {
  std::vector<bench::SuiteSpec> specs;
  if (o.suite == "throughput" || o.suite == "all") specs.push_back(bench::throughput_suite());
  if (o.suite == "decode" || o.suite == "all") specs.push_back(bench::decode_suite());
  for (auto& s : specs) {
    if (o.warmup) s.warmup = *o.warmup;
    if (o.requests) s.requests = *o.requests;
    if (o.prompt_tokens) s.prompt_tokens = *o.prompt_tokens;
    if (o.output_tokens) s.output_tokens = *o.output_tokens;
  }
  return specs;
}

// One line per request, redrawn in place on a terminal.
class Progress {
 public:
  Progress(std::string variant, bool enabled) : variant_(std::move(variant)), enabled_(enabled), tty_(isatty(2)) {}
  void operator()(const bench::SuiteSpec& spec, size_t i, size_t total, bool warmup) {
    if (!enabled_) return;
    constexpr size_t kWidth = 30;
    const size_t filled = total ? kWidth * i / total : 0;
    std::string bar(filled, '#');
    bar.append(kWidth - filled, '.');
    std::fprintf(stderr, "%s[%s] %-10s [%s] %zu/%zu%s%s", tty_ ? "\r" : "", variant_.c_str(), spec.name.c_str(),
                 bar.c_str(), i + 1, total, warmup ? " (warm-up)" : "          ", tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void done(const std::string& line) {
    if (!enabled_) return;
    std::fprintf(stderr, "%s[%s] %s\n", tty_ ? "\r\033[K" : "", variant_.c_str(), line.c_str());
  }

 private:
  std::string variant_;
  bool enabled_, tty_;
};

bench::VariantResult run_model(const ModelArg& m, const BenchCliOptions& o, const std::vector<bench::SuiteSpec>& specs,
                               const std::filesystem::path& text, bench::PowerMonitor& monitor,
                               const std::vector<std::string>& unavailable) {
  bench::VariantResult v;
  v.variant = m.label;
  v.model_path = m.path.string();
  v.runtime = std::string("Kestrel ") + KESTREL_VERSION;
  v.threads = o.threads;
  if (std::filesystem::is_directory(m.path)) {
    throw Error(m.path.string() + " is a directory (a Hugging Face checkpoint?); build an image from it first");
  }
  v.precision = precision_of(m.path);
  std::error_code ec;
  const auto size = std::filesystem::file_size(m.path, ec);
  if (!ec) v.size_bytes = size;
  v.peak_since = bench::reset_peak_rss() ? "model load" : "process start";

  runtime::EngineOptions eo;
  eo.n_threads = o.threads;
  eo.n_ctx = o.ctx;
  eo.load.precision = quant::Precision::kAuto;  // as `kestrel run` loads it
  eo.load.kv_types = kv_types_of(o.cache_type_k, o.cache_type_v);
  runtime::Engine engine(m.path, eo);
  if (runtime::parse_draft_mode(o.draft) == runtime::DraftMode::kModel) {
    engine.load_draft_model(draft_model_argument(o.draft, m.path, true), eo);
  }
  if (v.threads == 0) v.threads = static_cast<int>(engine.pool().size());
  v.n_ctx = engine.n_ctx();
  v.kv_cache_bytes = engine.cache().bytes();
  for (const auto& s : specs) {
    if (s.prompt_tokens + s.output_tokens > engine.n_ctx()) {
      const size_t max_ctx = engine.model().info().context_length;
      throw Error("suite " + s.name + " needs " + std::to_string(s.prompt_tokens + s.output_tokens) +
                  " positions; the context is " + std::to_string(engine.n_ctx()) +
                  (engine.n_ctx() < max_ctx ? " (raise --ctx, up to the model's maximum " + std::to_string(max_ctx) + ")"
                                            : ", the model's maximum (lower --prompt-tokens or --output-tokens)"));
    }
  }
  const std::vector<bench::TokenId> stream = bench::text_token_stream(engine.tokenizer(), text);
  std::vector<std::vector<std::vector<bench::TokenId>>> prompts;
  for (const auto& s : specs) prompts.push_back(bench::suite_prompts(s, stream, engine.tokenizer()));

  // At rest with the model loaded: idle power, then the resident memory.
  v.power_sources = monitor.sources();
  v.power_unavailable = unavailable;
  if (monitor.available() && o.idle_seconds > 0) {
    bench::SteadyClock clock;
    const auto e0 = monitor.energy_j();
    const double t0 = clock.now_s();
    std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_seconds));
    const auto e1 = monitor.energy_j();
    v.idle_seconds = clock.now_s() - t0;
    if (e0 && e1 && v.idle_seconds > 0) v.idle_power_w = (*e1 - *e0) / v.idle_seconds;
  }
  v.rss_idle_bytes = bench::read_rss().rss_bytes;

  bench::EngineGenerator generator(engine, runtime::parse_draft_mode(o.draft), o.draft_max);
  bench::SteadyClock clock;
  Progress progress(m.label, !o.no_progress);
  for (size_t i = 0; i < specs.size(); ++i) {
    v.suites.push_back(bench::run_suite(specs[i], prompts[i], generator, clock, &monitor, std::ref(progress)));
    const auto& r = v.suites.back();
    char line[256];
    std::snprintf(line, sizeof line, "%s: prefill %.1f tok/s, decode %.1f tok/s, end-to-end %.3f s (mean of %zu)%s",
                  r.spec.name.c_str(), r.prefill_tok_s.mean, r.decode_tok_s.mean, r.e2e_s.mean, r.spec.requests,
                  r.drafted_tokens > 0 ? (", drafted " + std::to_string(r.drafted_tokens) + ", accepted " +
                                          std::to_string(r.accepted_tokens)).c_str()
                                       : "");
    progress.done(line);
  }
  v.peak_rss_bytes = bench::read_rss().peak_bytes;
  return v;
}

int dump_prompts(const BenchCliOptions& o, const std::vector<bench::SuiteSpec>& specs, const std::filesystem::path& text) {
  const ModelArg m = parse_model_arg(o.models.empty() ? "" : o.models.front());
  runtime::EngineOptions eo;
  eo.n_threads = 1;
  eo.n_ctx = 1;
  runtime::Engine engine(m.path, eo);
  const auto stream = bench::text_token_stream(engine.tokenizer(), text);
  json out = {{"schema", "kestrel-bench-prompts/1"}, {"text", text.string()}, {"suites", json::object()}};
  for (const auto& s : specs) {
    out["suites"][s.name] = {{"prompt_tokens", s.prompt_tokens}, {"output_tokens", s.output_tokens},
                             {"warmup_requests", s.warmup}, {"measured_requests", s.requests}, {"same_prompt", s.same_prompt},
                             {"prompts", bench::suite_prompts(s, stream, engine.tokenizer())}};
  }
  write_file(o.dump_prompts, out.dump());
  return 0;
}

// --sensors: what the machine offers, and the power over --idle-seconds at rest.
int list_sensors(const BenchCliOptions& o) {
  bench::SteadyClock clock;
  bench::SensorScan scan = bench::scan_sensors();
  for (const auto& s : scan.sensors) {
    const auto v = s->read();
    std::printf("sensor       %s: %s\n", s->describe().c_str(),
                v ? (std::to_string(*v) + (s->cumulative() ? " J" : " W")).c_str() : "unreadable now");
  }
  for (const auto& u : scan.unavailable) std::printf("not used     %s\n", u.c_str());
  bench::PowerMonitor monitor(std::move(scan.sensors), clock);
  if (!monitor.available()) {
    std::printf("energy       %s\n", bench::no_sensor_text(scan.unavailable).c_str());
    return 0;
  }
  const auto e0 = monitor.energy_j();
  const double t0 = clock.now_s();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_seconds));
  const auto e1 = monitor.energy_j();
  const double dt = clock.now_s() - t0;
  if (e0 && e1 && dt > 0) {
    std::printf("idle power   %.3f W (%.3f J over %.2f s)\n", (*e1 - *e0) / dt, *e1 - *e0, dt);
  } else {
    std::printf("idle power   n/a (the sensors could not be read)\n");
  }
  return 0;
}

// --text, else $KESTREL_BENCH_TEXT, else the OpenAssistant file; kestrel::Error, before any model
// is loaded, when it is missing, not a file, or empty.
std::filesystem::path bench_text(const BenchCliOptions& o) {
  std::filesystem::path text = o.text;
  if (text.empty()) {
    const char* env = std::getenv("KESTREL_BENCH_TEXT");
    text = env && *env ? env : kDefaultText;
  }
  const std::string what = "the benchmark text " + text.string();
  const char* pass = "; pass --text FILE (OpenAssistant's en-validation.jsonl, or any text file)";
  std::error_code ec;
  const auto status = std::filesystem::status(text, ec);
  if (!std::filesystem::exists(status)) throw Error(what + " does not exist" + pass);
  if (std::filesystem::is_directory(status)) throw Error(what + " is a directory" + pass);
  // A device or a pipe (/dev/null, <(...)) is not read: it has no text to cut prompts from.
  if (!std::filesystem::is_regular_file(status)) {
    throw Error(what + " has no text: it is not a regular file (a device or a pipe)" + pass);
  }
  if (std::filesystem::file_size(text, ec) == 0 && !ec) throw Error(what + " is empty: it has no text" + pass);
  return text;
}

// --concurrency N,...: for each model and N, rounds of N greedy requests started together through
// the scheduler (prompts of --prompt-tokens, default 64, cut from the text; --output-tokens,
// default 128; --requests rounds, default 3). Medians over rounds; ITL percentiles over every gap.
int run_concurrency_bench(const BenchCliOptions& o) {
  const std::filesystem::path text = bench_text(o);
  const size_t prompt_tokens = o.prompt_tokens.value_or(64), output_tokens = o.output_tokens.value_or(128);
  const size_t rounds = o.requests.value_or(3);
  if (prompt_tokens < 2) throw Error("--prompt-tokens must be at least 2");
  size_t max_n = 0;
  for (size_t n : o.concurrency) max_n = std::max(max_n, n);
  std::string md = "| model | concurrency | aggregate decode tok/s | vs 1 stream | all streams decoding tok/s | vs 1 stream | "
                   "read bound | per-stream tok/s | ITL p50 ms | ITL p99 ms | worst stream's ITL p99 ms | TTFT p50 ms | "
                   "TTFT max ms |\n"
                   "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  json report = {{"schema", "kestrel-bench-concurrency/1"}, {"machine", machine_json()}, {"rows", json::array()}};
  const std::vector<std::string> models = o.models.empty() ? std::vector<std::string>{""} : o.models;
  for (const auto& arg : models) {
    const ModelArg m = parse_model_arg(arg);
    runtime::EngineOptions eo;
    eo.n_threads = o.threads;
    eo.load.precision = quant::Precision::kAuto;  // as `kestrel serve` loads it
    eo.load.kv_types = kv_types_of(o.cache_type_k, o.cache_type_v);
    eo.n_ctx = std::min<size_t>(o.ctx.value_or(SIZE_MAX), prompt_tokens + output_tokens + 1);
    runtime::Engine engine(m.path, eo);
    const std::vector<bench::TokenId> stream = bench::text_token_stream(engine.tokenizer(), text);
    std::optional<bench::TokenId> bos;
    if (engine.tokenizer().add_bos()) bos = engine.tokenizer().bos();
    const auto prompts = bench::cut_prompts(stream, bos, prompt_tokens, max_n * rounds);
    // The read bound (Engine::decode_row_bytes): what n streams could give over one if a step
    // cost only its bytes, taken mid-answer; rows probing the same clusters would share more.
    model::KvCache mid = engine.model().new_cache(prompt_tokens + output_tokens + 1);
    mid.n_past = prompt_tokens + output_tokens / 2;
    const double b1 = static_cast<double>(engine.decode_read_bytes(mid));
    const double b_row = static_cast<double>(engine.decode_row_bytes(mid));
    double single = 0, single_steady = 0;
    // "2.36x", or empty before a one-stream row.
    const auto ratio = [](double x, double one) { return one > 0 ? std::to_string(x / one).substr(0, 4) + "x" : std::string(); };
    for (size_t n : o.concurrency) {
      std::vector<double> aggregate, steady, itl, itl_p99, ttft;
      for (size_t r = 0; r < rounds; ++r) {
        if (!o.no_progress) std::fprintf(stderr, "\r%s: %zu streams, round %zu/%zu ", m.label.c_str(), n, r + 1, rounds);
        const auto round = bench::run_concurrency_round(
            engine, std::span(prompts).subspan(r * max_n, n), output_tokens, o.prefill_chunk);
        aggregate.push_back(round.aggregate_decode_tok_s);
        steady.push_back(round.steady_decode_tok_s);
        itl.insert(itl.end(), round.itl_s.begin(), round.itl_s.end());
        itl_p99.insert(itl_p99.end(), round.itl_p99_s.begin(), round.itl_p99_s.end());
        ttft.insert(ttft.end(), round.ttft_s.begin(), round.ttft_s.end());
      }
      const double agg = bench::percentile(aggregate, 50), agg_steady = bench::percentile(steady, 50);
      if (n == 1) single = agg, single_steady = agg_steady;
      const double worst_p99 = *std::max_element(itl_p99.begin(), itl_p99.end());
      const double nd = static_cast<double>(n), read_bound = nd * b1 / (b1 + (nd - 1) * b_row);
      char line[512];
      std::snprintf(line, sizeof(line),
                    "| %s | %zu | %.1f | %s | %.1f | %s | %.2fx | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f |\n",
                    m.label.c_str(), n, agg, ratio(agg, single).c_str(), agg_steady,
                    ratio(agg_steady, single_steady).c_str(), read_bound, agg / nd, 1e3 * bench::percentile(itl, 50), 1e3 * bench::percentile(itl, 99),
                    1e3 * worst_p99, 1e3 * bench::percentile(ttft, 50), 1e3 * bench::percentile(ttft, 100));
      md += line;
      report["rows"].push_back({{"model", m.label}, {"path", m.path.string()}, {"concurrency", n},
                                {"prompt_tokens", prompt_tokens}, {"output_tokens", output_tokens},
                                {"threads", engine.pool().size()}, {"prefill_chunk", o.prefill_chunk},
                                {"step_read_bytes", b1}, {"row_read_bytes", b_row}, {"read_bound_ratio", read_bound},
                                {"aggregate_decode_tok_s", aggregate}, {"steady_decode_tok_s", steady}, {"itl_s", itl}, {"itl_p99_per_stream_s", itl_p99},
                                {"ttft_s", ttft}});
    }
  }
  if (!o.no_progress) std::fprintf(stderr, "\n");
  if (!o.json_out.empty()) write_file(o.json_out, report.dump(1) + "\n");
  if (!o.markdown_out.empty()) write_file(o.markdown_out, md);
  std::cout << md;
  return 0;
}

int run_bench(const BenchCliOptions& o) {
  if (o.sensors) return list_sensors(o);
  apply_kernels_option(o.kernels);
  if (!o.concurrency.empty()) return run_concurrency_bench(o);
  const std::vector<bench::SuiteSpec> specs = suites_of(o);
  const std::filesystem::path text = bench_text(o);
  for (const auto& spec : specs) {
    if (spec.requests == 0) throw Error("--requests must be at least 1");
    if (spec.prompt_tokens < 2) throw Error("--prompt-tokens must be at least 2");
  }
  if (!o.dump_prompts.empty()) return dump_prompts(o, specs, text);
  // The outputs must be writable before minutes of measuring.
  // (A file this check creates is removed again: a run that fails leaves no empty report.)
  for (const std::string& out : {o.json_out, o.markdown_out}) {
    if (out.empty()) continue;
    std::error_code ec;
    const bool existed = std::filesystem::exists(out, ec);
    if (!std::ofstream(out, std::ios::binary | std::ios::app)) throw Error("cannot write " + out);
    if (!existed) std::filesystem::remove(out, ec);
  }

  // Rows from other runs (the llama.cpp peers script), read first so a bad file fails early.
  std::vector<json> extra;
  for (const auto& path : o.add_rows) {
    json j;
    try {
      j = json::parse(read_file(path));
    } catch (const json::exception& e) {
      throw Error(path + ": not JSON: " + e.what());
    }
    if (j.value("schema", "") != bench::kSchema || !j.contains("variants") || !j["variants"].is_array()) {
      throw Error(path + ": not a kestrel bench report (schema " + bench::kSchema + ")");
    }
    for (const auto& v : j["variants"]) extra.push_back(v);
  }

  bench::SteadyClock monitor_clock;
  bench::SensorScan scan = bench::scan_sensors();
  bench::PowerMonitor monitor(std::move(scan.sensors), monitor_clock);

  json report = {{"schema", bench::kSchema}, {"machine", machine_json()}};
  report["settings"] = {{"text", text.string()},
                        {"idle_seconds", o.idle_seconds},
                        {"card_settings", !o.warmup && !o.requests && !o.prompt_tokens && !o.output_tokens}};
  report["variants"] = json::array();
  const std::vector<std::string> models = o.models.empty() ? std::vector<std::string>{""} : o.models;
  for (const auto& arg : models) {
    const ModelArg m = parse_model_arg(arg);
    report["variants"].push_back(bench::variant_json(run_model(m, o, specs, text, monitor, scan.unavailable)));
  }
  for (auto& v : extra) report["variants"].push_back(v);

  const std::string md = bench::markdown_report(report);
  if (!o.json_out.empty()) write_file(o.json_out, report.dump(1) + "\n");
  if (!o.markdown_out.empty()) write_file(o.markdown_out, md);
  std::cout << md;
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchCliOptions>();
  auto* cmd = app.add_subcommand(
      "bench", "The model card's benchmark: throughput (2,048 in / 128 out, 3 warm-ups + 20) and decode "
               "(3,072 in / 50 out, 2 warm-ups + 10) suites, memory, power, size; the variants table");
  cmd->add_option("-m,--model", o->models,
                  "Model file (GGUF or Kestrel image), repeatable, one table row each; LABEL=PATH names the "
                  "row (default: $KESTREL_MODEL or Gemma 3 270M)");
  cmd->add_option("--suite", o->suite, "Suites to run")
      ->check(CLI::IsMember({"throughput", "decode", "all"}))
      ->capture_default_str();
  cmd->add_option("--json", o->json_out, "Write every figure (each request) as JSON to this file");
  cmd->add_option("--markdown", o->markdown_out, "Write the Markdown tables to this file (also printed)");
  cmd->add_option("--text", o->text,
                  "Text the prompts are cut from (default: $KESTREL_BENCH_TEXT, else "
                  "../shared/data/oasst/en-validation.jsonl)");
  cmd->add_option("-t,--threads", o->threads, "Threads (default: every core)")
      ->check(integer_range(0, ThreadPool::kMaxThreads));
  add_kernels_option(*cmd, o->kernels);
  cmd->add_option("-c,--ctx", o->ctx,
                  "Context size in tokens (KV cache; default 4096, or the model's maximum if smaller; more than "
                  "the model's maximum is an error)")
      ->check(integer_range(size_t{2}, size_t{1} << 24));
  cmd->add_option("--add-rows", o->add_rows,
                  "Add the rows of another bench JSON (e.g. scripts/bench/peers_bench.py's) to the table; repeatable");
  cmd->add_option("--idle-seconds", o->idle_seconds, "Seconds of idle power sampling per model (when a sensor is readable)")
      ->check(number_range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Override every suite's warm-up count (quick checks only)")
      ->check(integer_range(size_t{0}, size_t{1000}));
  cmd->add_option("--requests", o->requests, "Override every suite's measured request count (quick checks only)")
      ->check(integer_range(size_t{1}, size_t{1000}));
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Override every suite's prompt length (quick checks only)")
      ->check(integer_range(size_t{2}, size_t{1} << 20));
  cmd->add_option("--output-tokens", o->output_tokens, "Override every suite's output length (quick checks only)")
      ->check(integer_range(size_t{1}, size_t{1} << 20));
  cmd->add_option("--dump-prompts", o->dump_prompts,
                  "Only write the suites' prompt token ids (JSON) to this file and exit (for the peers script)");
  cmd->add_flag("--no-progress", o->no_progress, "No progress bar on stderr");
  cmd->add_option("--concurrency", o->concurrency,
                  "Instead of the suites: N greedy requests at once through the continuous-batching "
                  "scheduler, for each N given (e.g. --concurrency 1,2,4): aggregate decode tok/s, ITL, TTFT")
      ->delimiter(',')
      ->check(integer_range(size_t{1}, size_t{64}));
  cmd->add_option("--draft", o->draft,
                  "Speculative decoding in the suites: none (default, the model card's plain decode), ngram, "
                  "auto, default (the default model) or IMAGE (a draft model with the same vocabulary); the "
                  "tokens are the same (greedy), the JSON counts drafted and accepted tokens")
      ->check(draft_check())
      ->capture_default_str();
  cmd->add_option("--draft-max", o->draft_max, "Tokens drafted per verification at most")
      ->check(integer_range(size_t{0}, runtime::kMaxDraft))
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "With --concurrency: the scheduler's prefill chunk (8-256)")
      ->check(integer_range(size_t{8}, size_t{256}))
      ->capture_default_str();
  add_kv_cache_options(*cmd, o->cache_type_k, o->cache_type_v);
  cmd->add_flag("--sensors", o->sensors,
                "Only list the power/energy sensors found (and why others are not used), measure the idle "
                "power over --idle-seconds, and exit");
  return [o] { return run_bench(*o); };
}

}  // namespace kestrel::tools
