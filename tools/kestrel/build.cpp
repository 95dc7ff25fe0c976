// kestrel build: a source checkpoint in, a Kestrel image out.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/image/builder.h"
#include "kestrel/image/hf_gemma3.h"
#include "kestrel/image/tensor_types.h"
#include "kestrel/runtime/calibration.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/model_path.h"
#include "option_checks.h"
#include "partial_file.h"

namespace kestrel::tools {
namespace {

struct BuildCommandOptions {
  std::string source;
  std::string assistant;  // --assistant: a Gemma 4 MTP assistant checkpoint directory
  std::string out;
  std::string precision = "w4a16";
  size_t group_size = 32;
  uint64_t seed = 0;
  int threads = 0;
  std::string embedding = "source";
  bool symmetric = false;
  std::string zero_points = "float";
  int scale_bits = 16;
  std::string int4_layout = "int8";
  std::string calib;
  size_t calib_tokens = 32768;
  size_t calib_sample = 256;
  bool no_awq = false;
  size_t awq_grid = 20;
  bool gptq = false;
  std::vector<std::string> licenses;
  std::vector<std::string> tensor_types;  // PATTERN=TYPE, validated by the option's check
  bool flashhead = false;
  size_t cluster_size = 16;
  size_t probes = 0;
  size_t flashhead_iterations = 8;
  float radius_weight = 0.1f;
  bool as_default = false;
};

// FlashHead clustering progress: a redrawn line on a terminal, a line per fifth otherwise.
void clustering_progress(double fraction, const std::string& what) {
  static const bool tty = isatty(fileno(stderr)) != 0;
  static int last_fifth = -1;
  const int percent = static_cast<int>(100 * fraction);
  if (!tty) {
    if (percent / 20 != last_fifth) {
      last_fifth = percent / 20;
      std::fprintf(stderr, "kestrel build: FlashHead clustering %3d%% (%s)\n", percent, what.c_str());
    }
    return;
  }
  std::fprintf(stderr, "\rFlashHead clustering %3d%% %-40.40s", percent, what.c_str());
  if (fraction >= 1.0) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

// Redraws one line on a terminal; prints a line per tenth of the work otherwise (logs, CI).
void progress_bar(size_t done, size_t total, const std::string& name) {
  static const bool tty = isatty(fileno(stderr)) != 0;
  if (!tty) {
    if (done == total || (10 * done / total) != (10 * (done - 1) / total)) {
      std::fprintf(stderr, "kestrel build: %3zu%% (%zu/%zu tensors)\n", 100 * done / total, done, total);
    }
    return;
  }
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / total);
  std::fprintf(stderr, "\r[%.*s%*s] %3zu%% %-40.40s", filled, "##############################",
               kWidth - filled, "", 100 * done / total, name.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

int build(const BuildCommandOptions& o) {
  if (o.as_default) {
    std::error_code ec;
    const auto dir = std::filesystem::path(o.out).parent_path();
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("cannot create " + dir.string() + ": " + ec.message());
  }
  const auto t0 = std::chrono::steady_clock::now();  // the printed time includes calibration
  remove_partial_on_signal(o.out);
  image::BuildOptions options;
  options.precision = quant::parse_precision(o.precision);
  options.group_size = o.group_size;
  options.seed = o.seed;
  options.embedding = o.embedding == "int4"   ? image::BuildOptions::Embedding::kInt4
                      : o.embedding == "q8_0" ? image::BuildOptions::Embedding::kQ8_0
                                              : image::BuildOptions::Embedding::kSource;
  options.zero_points = !o.symmetric;
  options.integer_zero_points = !o.symmetric && o.zero_points == "int";
  options.scale_bits = o.scale_bits;
  options.int8_layout = o.int4_layout == "int8";
  for (const auto& l : o.licenses) options.license_files.emplace_back(l);
  for (const auto& spec : o.tensor_types) options.tensor_types.push_back(image::parse_tensor_type(spec));
  options.progress = progress_bar;
  options.flashhead = o.flashhead;
  options.flashhead_clustering.cluster_size = o.cluster_size;
  options.flashhead_clustering.iterations = o.flashhead_iterations;
  options.flashhead_clustering.seed = o.seed;
  options.flashhead_clustering.progress = clustering_progress;
  options.flashhead_probes = o.probes;
  options.flashhead_radius_weight = o.radius_weight;
  if (!o.assistant.empty()) options.assistant = o.assistant;
  const std::filesystem::path source = runtime::model_path_argument(o.source);
  // A directory with config.json: a Hugging Face checkpoint (image/hf_gemma3.h).
  const bool hf = image::is_hf_checkpoint(source);
  if (hf && !o.calib.empty()) {
    throw Error("--calib needs a GGUF source (the calibration pass runs the model, which kestrel "
                "cannot load from a Hugging Face directory); build a bf16 image first and calibrate from a GGUF");
  }
  if (!hf) {
    // Before the calibration pass: an image as the source, or a pattern that matches nothing, is
    // refused at once.
    const gguf::File file = gguf::File::open(source);
    image::check_not_an_image(file, source);
    if (!options.tensor_types.empty()) image::check_overrides_match(file, options.tensor_types);
  }
  options.awq_scaling = !o.no_awq;
  options.awq_grid = o.awq_grid;
  options.gptq = o.gptq;
  options.log = [](const std::string& m) { std::fprintf(stderr, "kestrel build: %s\n", m.c_str()); };
  quant::ActivationStatsMap calibration;
  if (!o.calib.empty()) {
    // Calibration runs the source model as it is (exact weights) over the text.
    runtime::Engine engine(source, {o.threads, std::nullopt, {}});
    const std::string text = runtime::calibration_text(o.calib, o.calib_tokens * 8);
    auto tokens = engine.tokenizer().encode(text, false, false);
    if (tokens.size() > o.calib_tokens) tokens.resize(o.calib_tokens);
    if (tokens.size() < 64) {
      throw Error("the calibration text " + o.calib + " has " + std::to_string(tokens.size()) +
                  " tokens; at least 64 are needed (a few thousand are better)");
    }
    std::fprintf(stderr, "kestrel build: calibrating on %zu tokens of %s\n", tokens.size(), o.calib.c_str());
    runtime::CalibrationOptions calib;
    calib.sample_rows = o.no_awq && !o.gptq ? 0 : o.calib_sample;
    calib.seed = o.seed;
    calibration = runtime::collect_activation_stats(engine, tokens, calib);
    options.calibration = &calibration;
    options.calibration_sha256 = image::sha256_hex(text);
  }
  ThreadPool pool(o.threads);
  const auto report =
      hf ? image::build_image_from_hf(source, o.out, options, pool,
                                      [](const std::string& m) { std::fprintf(stderr, "kestrel build: %s\n", m.c_str()); })
         : image::build_image(source, o.out, options, pool);
  const std::string precision =
      o.precision == "w4a16" && o.scale_bits == 8 ? o.precision + " (8-bit group scales)" : o.precision;
  std::printf("built %s: %s, %.1f MiB from %.1f MiB source (sha256 %s), %zu tensors, %.1f s\n",
              o.out.c_str(), precision.c_str(), static_cast<double>(report.image_bytes) / (1 << 20),
              static_cast<double>(report.source_bytes) / (1 << 20), report.source_sha256.c_str(),
              report.n_tensors, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (o.flashhead) {
    std::printf("FlashHead: clusters of %zu, clustering %.1f s, mean cosine of a row to its cluster %.3f\n",
                o.cluster_size, report.flashhead_seconds, report.flashhead_mean_cosine);
  }
  return 0;
}

}  // namespace

Command add_build_command(CLI::App& app) {
  auto o = std::make_shared<BuildCommandOptions>();
  auto* cmd = app.add_subcommand("build", "Build a Kestrel model image from a GGUF checkpoint");
  cmd->add_option("source", o->source, "Source GGUF file ('default': the default model) or Hugging Face Gemma 3 checkpoint directory")->required();
  cmd->add_option("-o,--output", o->out, "Image file to write (required unless --as-default)");
  cmd->add_flag("--as-default", o->as_default,
                "Build the default model's W4A16 + FlashHead image into the cache ($KESTREL_CACHE/images/, else "
                "~/.cache/kestrel/images/), where run, chat and serve find it for -m default");
  cmd->add_option("--precision", o->precision,
                  "w4a16 (INT4 weights), or bf16 / fp16 (the unquantized baseline)")
      ->check(CLI::IsMember({"w4a16", "bf16", "fp16"}))
      ->capture_default_str();
  cmd->add_option("--group-size", o->group_size, "w4a16: weights per fp16 scale")
      ->check(CLI::IsMember({32, 64, 128}))
      ->capture_default_str();
  cmd->add_option("--tensor-type", o->tensor_types,
                  "w4a16: PATTERN=TYPE, store the layer matrices whose name matches PATTERN (whole "
                  "dot-separated components: attn_v, ffn_down, blk.3, blk.3.ffn_down.weight) as TYPE: "
                  "w4 (INT4), q8_0 or bf16; repeatable, the last match wins")
      ->check(CLI::Validator(
          [](const std::string& spec) {
            try {
              image::parse_tensor_type(spec);
              return std::string();
            } catch (const std::exception& e) {
              const std::string what = e.what(), prefix = "--tensor-type ";
              return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
            }
          },
          "PATTERN=TYPE"))
      ->allow_extra_args(false);
  cmd->add_option("--embedding", o->embedding,
                  "w4a16: the token embedding / output head (and Gemma 4's per-layer token table and model "
                  "projection) as in the source, INT4, or Q8_0")
      ->check(CLI::IsMember({"source", "int4", "q8_0"}))
      ->capture_default_str();
  cmd->add_option("--calib", o->calib,
                  "w4a16: calibration text (plain text, or OpenAssistant .jsonl: the text of its "
                  "rows in file order) for activation-aware quantization");
  cmd->add_option("--calib-tokens", o->calib_tokens, "Calibration tokens to use at most")
      ->check(integer_range(size_t{64}, size_t{1} << 22))
      ->capture_default_str();
  cmd->add_option("--calib-sample", o->calib_sample,
                  "Calibration input rows kept per matrix input for AWQ's scale search")
      ->check(integer_range(size_t{16}, size_t{65536}))
      ->capture_default_str();
  cmd->add_flag("--no-awq", o->no_awq,
                "With --calib: no AWQ per-channel scaling, only the activation-weighted group fit");
  cmd->add_flag("--gptq", o->gptq,
                "With --calib: GPTQ error compensation on the recorded input rows (after AWQ's scaling)");
  cmd->add_option("--awq-grid", o->awq_grid, "AWQ: alpha values tried in [0, 1]")
      ->check(integer_range(size_t{2}, size_t{200}))
      ->capture_default_str();
  cmd->add_flag("--symmetric", o->symmetric,
                "w4a16: symmetric groups (scale only) instead of affine groups (scale and min)");
  cmd->add_option("--zero-points", o->zero_points,
                  "w4a16 affine groups: 'float' (a free fp16 minimum per group) or 'int' (an integer zero "
                  "point 0..15 per group, w = d (q - z): what compressed-tensors stores, so `kestrel export` "
                  "writes the image exactly)")
      ->check(CLI::IsMember({"float", "int"}))
      ->capture_default_str();
  cmd->add_option("--scale-bits", o->scale_bits,
                  "w4a16: bits of each group's scale and minimum: 16 (fp16) or 8 (u8 under an fp16 "
                  "pair per row: 4.5 instead of 5 bits per weight at group size 32; affine groups only)")
      ->check(CLI::IsMember({8, 16}))
      ->capture_default_str();
  cmd->add_option("--int4-layout", o->int4_layout,
                  "w4a16: how INT4 layer matrices are stored: 'int8' (as the int8 kernels read them: a load "
                  "on AVX2 / AVX512-VNNI maps them, no copy) or 'plain' (row-major, as before 2026-12-07: each "
                  "load makes the int8 copy); docs/image-format.md")
      ->check(CLI::IsMember({"int8", "plain"}))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed recorded in the image (for calibrated builds)")
      ->check(integer_range(uint64_t{0}, UINT64_MAX));
  cmd->add_option("--license", o->licenses,
                  "Licence/NOTICE file to carry (repeatable; LICENSE*, NOTICE*, *TERMS* files "
                  "next to the source are added automatically)");
  cmd->add_option("--assistant", o->assistant,
                  "Gemma 4 target from a Hugging Face directory: also store this Gemma 4 MTP assistant checkpoint "
                  "(model_type gemma4_assistant) in the image, for speculative decoding (docs/speculative.md)");
  cmd->add_flag("--flashhead", o->flashhead,
                "Add FlashHead, the two-stage retrieval LM head (docs/flashhead.md)");
  cmd->add_option("--cluster-size", o->cluster_size, "FlashHead: tokens per cluster (must divide the vocabulary)")
      ->check(integer_range(size_t{1}, size_t{4096}))
      ->capture_default_str();
  cmd->add_option("--probes", o->probes, "FlashHead: default clusters probed per step (default: 1/16 of the clusters, 1,024 for a 262,144-token vocabulary)")
      ->check(integer_range(size_t{1}, size_t{1} << 24));
  cmd->add_option("--radius-weight", o->radius_weight,
                  "FlashHead: alpha of the stage-1 score centroid.h + alpha |h| radius (0: the mean logit)")
      ->check(number_range(0.0, 10.0))
      ->capture_default_str();
  cmd->add_option("--flashhead-iterations", o->flashhead_iterations, "FlashHead: k-means iterations per level")
      ->check(integer_range(size_t{1}, size_t{100}))
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: every core)")
      ->check(integer_range(0, ThreadPool::kMaxThreads));
  // Options that only mean something together: usage errors (exit 2) before any work.
  cmd->callback([o, cmd] {
    const auto given = [cmd](const char* name) { return cmd->get_option(name)->count() > 0; };
    if (o->as_default) {  // the default model's W4A16 + FlashHead image, where -m default finds it
      if (o->source != "default") {
        throw CLI::ValidationError("--as-default", "builds the default model's image: the source must be 'default'");
      }
      if (const char* env = std::getenv("KESTREL_MODEL"); env != nullptr && *env != '\0') {
        throw CLI::ValidationError("--as-default", "builds the default model's image, but KESTREL_MODEL names "
                                                   "another model (the one -m default runs); unset it, or use -o");
      }
      if (given("-o")) {
        throw CLI::ValidationError("--as-default", "chooses the output (" + runtime::default_image_path().string() +
                                                   "); drop -o");
      }
      if (o->precision != "w4a16") throw CLI::ValidationError("--as-default", "builds a w4a16 image");
      o->out = runtime::default_image_path().string();
      o->flashhead = true;
    }
    if (o->out.empty()) throw CLI::ValidationError("-o,--output", "is required (or --as-default)");
    if (!o->flashhead && (given("--cluster-size") || given("--probes") || given("--radius-weight") ||
                          given("--flashhead-iterations"))) {
      throw CLI::ValidationError("--cluster-size, --probes, --radius-weight and --flashhead-iterations",
                                 "apply to --flashhead builds only");
    }
    if (o->precision != "w4a16" && (!o->calib.empty() || given("--group-size") || o->symmetric ||
                                    given("--embedding") || given("--scale-bits") || given("--int4-layout"))) {
      throw CLI::ValidationError("--calib, --group-size, --symmetric, --scale-bits, --embedding and --int4-layout",
                                 "apply to --precision w4a16 only");
    }
    if (o->calib.empty() && (o->no_awq || o->gptq || given("--awq-grid") || given("--calib-sample") ||
                             given("--calib-tokens"))) {
      throw CLI::ValidationError("--no-awq, --gptq, --awq-grid, --calib-sample and --calib-tokens",
                                 "apply to calibrated builds (--calib) only");
    }
    if (o->scale_bits == 8 && (o->symmetric || o->gptq || o->precision != "w4a16")) {
      throw CLI::ValidationError("--scale-bits 8", "needs --precision w4a16 with affine groups, without --symmetric or --gptq");
    }
    if (given("--zero-points") && (o->symmetric || o->scale_bits == 8 || o->gptq || o->precision != "w4a16")) {
      throw CLI::ValidationError("--zero-points", "applies to w4a16 affine groups with 16-bit scales (not with "
                                                  "--symmetric, --scale-bits 8 or --gptq)");
    }
    if (o->gptq && o->symmetric) {
      throw CLI::ValidationError("--gptq", "fits affine groups; it cannot be combined with --symmetric");
    }
    if (o->no_awq && given("--awq-grid")) {
      throw CLI::ValidationError("--awq-grid", "has no effect with --no-awq");
    }
    if (!o->tensor_types.empty() && o->precision != "w4a16") {
      throw CLI::ValidationError("--tensor-type", "applies to --precision w4a16 only (a " + o->precision +
                                                      " build stores every layer matrix as " + o->precision + ")");
    }
  });
  return [o] { return build(*o); };
}

}  // namespace kestrel::tools
