#include "common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kestrel/base/error.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/kernels/kernel_options.h"
#include "kestrel/runtime/image_cache.h"
#include "kestrel/runtime/model_path.h"
#include "option_checks.h"

namespace kestrel::tools {

void ModelOptions::add_to(CLI::App& cmd) {
  cmd.add_option("-m,--model", model,
                 "GGUF model file or Kestrel image (default or 'default': $KESTREL_MODEL, else Gemma 3 270M: its "
                 "W4A16 + FlashHead image once `kestrel build default --as-default` has built it, else its GGUF)");
  cmd.add_option("-t,--threads", threads, "Threads (default: every core)")
      ->check(integer_range(0, ThreadPool::kMaxThreads))
      ->group(kModelGroup);
  cmd.add_option("-c,--ctx", ctx,
                 "Context size in tokens (default 4096, or the model's maximum if smaller; 0: the "
                 "model's maximum)")
      ->check(integer_range(size_t{0}, size_t{1} << 24))
      ->group(kModelGroup);
  cmd.add_option("--precision", precision,
                 "Layer weights in memory: auto (an image as built; a GGUF's Q4_0/Q4_1/Q4_K tensors as "
                 "INT4 with their own codes, other quantized types as Q8_0, Q8_0/BF16/F16 as stored: "
                 "docs/quantization.md), source (as the file has them, other quantized types as float32: "
                 "the llama.cpp parity path), w4a16 (INT4 groups, re-quantized at load), bf16, fp16")
      ->check(CLI::IsMember({"auto", "source", "w4a16", "bf16", "fp16"}))
      ->capture_default_str()
      ->group(kModelGroup);
  cmd.add_option("--group-size", group_size, "w4a16: weights per scale (32, 64 or 128)")
      ->check(CLI::IsMember({32, 64, 128}))
      ->capture_default_str()
      ->group(kModelGroup);
  cmd.add_option("--head", head,
                 "Output head: auto (FlashHead when the image has it), dense, flash")
      ->check(CLI::IsMember({"auto", "dense", "flash"}))
      ->capture_default_str()
      ->group(kModelGroup);
  cmd.add_option("--probes", probes, "FlashHead clusters probed per token (default: the image's)")
      ->check(integer_range(size_t{1}, size_t{1} << 24))
      ->group(kModelGroup);
  cmd.add_option("--flashhead-proof", flashhead_proof,
                 "FlashHead: prove each greedy token equals the dense head's, probing more clusters (or all) "
                 "until it is proven (on: images built with the bound data; today it mostly scores every "
                 "cluster, docs/flashhead.md); off: the fixed probes alone")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str()
      ->group(kModelGroup);
  add_decode_act_option(cmd, "--decode-act", decode_act)->group(kModelGroup);
  add_kernels_option(cmd, kernels)->group(kModelGroup);
  add_kv_cache_options(cmd, cache_type_k, cache_type_v);
  cmd.add_flag("--no-image-cache", no_image_cache,
               "A GGUF at --precision auto: convert it at load, without the cached image of its converted form "
               "(~/.cache/kestrel/images/ or $KESTREL_CACHE/images/, written by the first run and mapped by the "
               "next; KESTREL_IMAGE_CACHE=0 does the same)")
      ->group(kModelGroup);
}

CLI::Option* add_kernels_option(CLI::App& cmd, std::string& value) {
  return cmd.add_option("--kernels", value,
                        "Kernel switches, comma-separated, for A/B runs (docs/kernels.md): int8 or bf16 (activations "
                        "for --decode-act auto), no-avx2, no-vnni, no-bf16-dot, no-bf16-attention, no-interleave, "
                        "amx (AMX-BF16 prefill, opt-in), w8a8 (opt-in); on top of $KESTREL_KERNELS");
}

void apply_kernels_option(const std::string& value) {
  // The environment's switches are read (and a bad value refused) here too, before any load: a bad
  // KESTREL_KERNELS is the user's setting, not a broken image (the default image's fallback would
  // otherwise report it as a damaged file).
  const kernels::KernelOptions& current = kernels::kernel_options();
  if (!value.empty()) kernels::set_kernel_options(kernels::parse_kernel_options(value, "--kernels", current));
}

void add_kv_cache_options(CLI::App& cmd, std::string& k, std::string& v) {
  const auto names = CLI::IsMember({"f16", "fp16", "bf16", "q8", "q8_0"});
  cmd.add_option("--cache-type-k", k,
                 "KV cache type of the keys (-ctk): f16, bf16, or q8 (int8 with an fp16 scale per 32 values, "
                 "llama.cpp's q8_0 size: 53 % of f16's memory and decode reads; docs/quantization.md)")
      ->check(names)
      ->capture_default_str()
      ->group(kModelGroup);
  cmd.add_option("--cache-type-v", v, "KV cache type of the values (-ctv): f16, bf16, q8")
      ->check(names)
      ->capture_default_str()
      ->group(kModelGroup);
}

model::KvTypes kv_types_of(const std::string& k, const std::string& v) {
  model::KvTypes t{kernels::parse_kv_type(k, "--cache-type-k"), kernels::parse_kv_type(v, "--cache-type-v")};
  const auto set = [](const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' && *value != '0';
  };
  t.k_hadamard = set("KESTREL_KV_HADAMARD");
  return t;
}

CLI::Option* add_decode_act_option(CLI::App& cmd, const std::string& name, std::string& value,
                                   const std::string& whose, const std::string& source_option) {
  return cmd.add_option(name, value,
                 (whose.empty() ? std::string() : whose + ": ") +
                     "INT4 layers' activations, decode and prefill alike: rounded to bf16 or int8; with int8 on AVX2 or VNNI, Q8_0 "
                     "layers and a dense Q8_0 head take int8 activations too (docs/quantization.md); auto: "
                     "--kernels int8|bf16 (or $KESTREL_KERNELS) when set, else int8 where the CPU has AVX512-VNNI or "
                     "AVX2. No effect on BF16/FP16 images" +
                     (source_option.empty() ? std::string()
                                            : " or a GGUF's float32 source form (" + source_option + ")"))
      ->check(CLI::IsMember({"auto", "bf16", "int8"}))
      ->capture_default_str();
}

std::string read_input_file(const std::string& path, uintmax_t max_bytes, const std::string& what) {
  const bool stdin_file = path == "-";
  const std::string name = stdin_file ? std::string("standard input (-)") : path;
  const auto too_large = [&](const std::string& size) {
    return Error(name + " has " + size + " MiB; " + what + " are limited to " + std::to_string(max_bytes >> 20) +
                 " MiB");
  };
  FILE* f = stdin;
  if (!stdin_file) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec) throw Error("cannot read " + path + ": " + ec.message());
    if (std::filesystem::is_directory(status)) throw Error("cannot read " + path + ": a directory, not a regular file");
    if (std::filesystem::is_regular_file(status)) {
      if (const auto size = std::filesystem::file_size(path, ec); !ec && size > max_bytes) {
        throw too_large(std::to_string(size >> 20));
      }
    }
    f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) throw Error("cannot read " + path + ": " + std::strerror(errno));
  }
  // A pipe or FIFO has no size to check first: read at most one byte past the limit.
  std::string text;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) {
    text.append(buffer, n);
    if (text.size() > max_bytes) break;
  }
  const bool failed = std::ferror(f) != 0;
  const int error = errno;
  if (!stdin_file) std::fclose(f);
  if (failed) throw Error("cannot read " + name + ": " + std::strerror(error));
  if (text.size() > max_bytes) throw too_large("more than " + std::to_string(max_bytes >> 20));
  return text;
}

runtime::EngineOptions ModelOptions::engine_options() const {
  runtime::EngineOptions o{threads, ctx, {quant::parse_precision(precision), group_size}};
  o.head = head == "dense" ? runtime::HeadMode::kDense
           : head == "flash" ? runtime::HeadMode::kFlash
                             : runtime::HeadMode::kAuto;
  o.probes = probes;
  o.flashhead_proof = flashhead_proof == "on";
  o.load.decode_activations = kernels::parse_decode_activations(decode_act);
  o.load.kv_types = kv_types_of(cache_type_k, cache_type_v);
  return o;
}

namespace {

void check_not_a_directory(const std::filesystem::path& path) {
  if (std::filesystem::is_directory(path)) {
    throw Error(path.string() + " is a directory (a Hugging Face checkpoint?); build an image from "
                "it first: kestrel build " + path.string() + " -o model.kimg");
  }
}

// The default model's GGUF runs with its layers as stored: say once how to get the fast path.
void hint_default_image() {
  std::fprintf(stderr,
               "kestrel: running the default GGUF as stored; `kestrel build default --as-default` (once, a few "
               "minutes) builds the faster W4A16 + FlashHead image that -m default then runs\n");
}

// The default image could not be loaded (an image from an older Kestrel, a damaged file): run the
// GGUF instead of failing, and say how to rebuild it.
void warn_default_image(const std::exception& e) {
  static bool warned = false;  // resolve() may run twice (serve names the model, then loads it)
  if (std::exchange(warned, true)) return;
  std::fprintf(stderr,
               "kestrel: the default image %s does not load (%s); running the default GGUF instead. "
               "Rebuild the image with `kestrel build default --as-default`\n",
               runtime::default_image_path().c_str(), e.what());
}

}  // namespace

runtime::RunnableModel ModelOptions::resolve() const {
  apply_kernels_option(kernels);
  runtime::RunnableModel m = runtime::runnable_model(model, precision == "auto");
  if (m.default_image) {
    // A cached image whose header does not read (an older format, a cut or damaged file) is
    // passed over here, before the server names the model after it; a damaged body is caught
    // by the checksum at load (load()).
    try {
      gguf::File::open(m.path);
    } catch (const Error& e) {
      warn_default_image(e);
      m = {runtime::default_model_path()};
    }
  }
  check_not_a_directory(m.path);
  return m;
}

// The hint only where the cached image would have run (not for a precision built at load), and
// only for a person at a terminal: scripts and pipes read stderr for errors ("kestrel: error:").
bool ModelOptions::hint_wanted(const runtime::RunnableModel& m) const {
  return m.default_gguf && precision == "auto" && isatty(STDERR_FILENO) != 0;
}

namespace {

// make(path) for the resolved model; a default image that fails to load for a reason of its own
// (an older format, a damaged file) is passed over for the default GGUF, with a warning. An
// option that does not fit the model (runtime::OptionMismatch) is the user's error: rethrown,
// as the GGUF would not take it either.
template <class Make>
auto load_resolved(const runtime::RunnableModel& m, Make make) -> decltype(make(m.path)) {
  if (!m.default_image) return make(m.path);
  try {
    return make(m.path);
  } catch (const runtime::OptionMismatch&) {
    throw;
  } catch (const Error& e) {
    warn_default_image(e);
  }
  return make(runtime::default_model_path());
}

void warn_line(const std::string& line) { std::fprintf(stderr, "kestrel: warning: %s\n", line.c_str()); }

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// make(path) for a GGUF at --precision auto through the image cache (runtime/image_cache.h): its
// cached image, written first where there is none; the GGUF itself where the cache is off, the
// GGUF cannot be cached or the image does not load. Sets o.image_cache to what happened.
// A file named *.kimg is taken for an image and loaded as it is (no look into the cache).
template <class Make>
auto load_cached(const ModelOptions& o, const std::filesystem::path& path, Make make) -> decltype(make(path)) {
  o.image_cache = "off";
  if (o.precision != "auto" || path.extension() == ".kimg" || !runtime::image_cache_enabled(o.no_image_cache)) {
    return make(path);
  }
  runtime::CachedImage c;
  try {
    c = runtime::cached_image(path, o.threads, warn_line);
  } catch (const Error&) {
    return make(path);  // a file that cannot be read: the load says what is wrong with it
  }
  // A hit that does not load (cut short, a checksum mismatch, an older format) is written again
  // and loaded once more; an image just written that does not load leaves the GGUF.
  while (c.status != runtime::ImageCacheStatus::kOff) {
    const bool hit = c.status == runtime::ImageCacheStatus::kHit;
    if (!hit) {
      std::fprintf(stderr,
                   "kestrel: converted %s once (%.1f s) and cached the result as a Kestrel image: %s (%.0f MiB); "
                   "later runs map it instead of converting (--no-image-cache or KESTREL_IMAGE_CACHE=0: off)\n",
                   path.filename().c_str(), c.seconds, c.path.c_str(), mib(c.bytes));
    } else if (isatty(STDERR_FILENO) != 0) {
      std::fprintf(stderr, "kestrel: mapping the cached image of %s: %s (%.0f MiB; --no-image-cache: convert instead)\n",
                   path.filename().c_str(), c.path.c_str(), mib(c.bytes));
    }
    try {
      o.image_cache = runtime::image_cache_status_name(c.status);
      return make(c.path);
    } catch (const runtime::OptionMismatch&) {
      throw;
    } catch (const Error& e) {
      warn_line((hit ? "the cached image " : "the image just written, ") + c.path.string() + " does not load (" +
                e.what() + (hit ? "); writing it again" : "); running from the GGUF"));
    }
    if (!hit) break;
    c = runtime::cached_image(path, o.threads, warn_line, /*rebuild=*/true);
  }
  o.image_cache = "off";
  return make(path);
}

}  // namespace

runtime::Engine ModelOptions::load() const {
  const runtime::RunnableModel m = resolve();
  if (hint_wanted(m)) hint_default_image();
  return load_resolved(m, [&](const std::filesystem::path& p) {
    return load_cached(*this, p, [&](const std::filesystem::path& q) { return runtime::Engine(q, engine_options()); });
  });
}

std::unique_ptr<runtime::Engine> ModelOptions::load_unique() const {
  const runtime::RunnableModel m = resolve();
  if (hint_wanted(m)) hint_default_image();
  return load_resolved(m, [&](const std::filesystem::path& p) {
    return load_cached(*this, p,
                       [&](const std::filesystem::path& q) { return std::make_unique<runtime::Engine>(q, engine_options()); });
  });
}

void SamplingOptions::add_to(CLI::App& cmd) {
  auto& s = sampler;
  cmd.add_option("-n,--n-predict", n_predict, "Tokens to generate at most")
      ->check(integer_range(size_t{0}, size_t{1} << 24))
      ->capture_default_str();
  cmd.add_option("--temp", s.temperature, "Temperature (0: greedy)")
      ->check(number_range(0.0f, 100.0f))
      ->capture_default_str()
      ->group(kSamplingGroup);
  cmd.add_option("--top-k", s.top_k, "Top-k (0: off)")
      ->check(integer_range(0, 1 << 30))
      ->capture_default_str()
      ->group(kSamplingGroup);
  cmd.add_option("--top-p", s.top_p, "Top-p (1: off)")
      ->check(number_range(0.0f, 1.0f))
      ->capture_default_str()
      ->group(kSamplingGroup);
  cmd.add_option("--min-p", s.min_p, "Min-p (0: off)")
      ->check(number_range(0.0f, 1.0f))
      ->capture_default_str()
      ->group(kSamplingGroup);
  cmd.add_option("--repeat-penalty", s.repeat_penalty, "Repetition penalty (1: off)")
      ->check(number_range(0.01f, 100.0f))
      ->capture_default_str()
      ->group(kSamplingGroup);
  cmd.add_option("--repeat-last-n", s.repeat_last_n, "Tokens the penalty looks back over (-1: all)")
      ->check(integer_range(-1, 1 << 24))
      ->capture_default_str()
      ->group(kSamplingGroup);
  cmd.add_option("-l,--logit-bias", logit_bias,
                 "TOKEN_ID+BIAS or TOKEN_ID-BIAS, repeatable: added to the token's logit before sampling, bias in "
                 "[-100, 100] (506-100 bans token 506; as llama.cpp's -l and the server's logit_bias)")
      ->check(CLI::Validator(
          [](std::string& spec) {
            try {
              parse_logit_bias_value(spec);
              return std::string();
            } catch (const Error& e) {
              return std::string(e.what());
            }
          },
          ""))
      ->group(kSamplingGroup);
  cmd.add_option("--seed", seed, "Random seed (-1: random)")
      ->check(integer_range(int64_t{-1}, INT64_MAX))
      ->capture_default_str()
      ->group(kSamplingGroup);
  cmd.add_flag("--ignore-eos", ignore_eos, "Keep generating past end-of-sequence tokens")->group(kSamplingGroup);
  cmd.add_option("--stop", stop, "Stop string (repeatable)")->group(kSamplingGroup);
  cmd.add_option("--draft", draft,
                 "Speculative decoding: none, ngram (prompt lookup: drafts what followed the last few "
                 "tokens earlier in the text), auto (the image's drafter when it has one, else ngram, "
                 "which pauses itself when its drafts miss), default (the default model, as -m default finds "
                 "it) or IMAGE (a smaller model image or GGUF with the same vocabulary drafts). With "
                 "--draft-accept exact the tokens are the same either way")
      ->check(draft_check())
      ->capture_default_str()
      ->group(kDraftGroup);
  cmd.add_option("--draft-max", draft_max, "Tokens drafted per verification at most")
      ->check(integer_range(size_t{0}, runtime::kMaxDraft))
      ->capture_default_str()
      ->group(kDraftGroup);
  cmd.add_option("--draft-accept", draft_accept, kDraftAcceptHelp)
      ->check(CLI::IsMember({"exact", "distribution"}))
      ->capture_default_str()
      ->group(kDraftGroup);
}

const char* const kDraftAcceptHelp =
    "How drafted tokens are kept: exact (each iff it is the token sampled at its row: the same tokens as "
    "without drafting, for a seed) or distribution (speculative sampling, Leviathan et al. 2023: a draft "
    "model at --temp > 0 samples its drafts and they are kept with probability min(1, p/q): the same "
    "distribution, more drafts kept, other samples for a seed). Greedy decoding is the same either way";

std::string draft_model_argument(const std::string& draft, const std::filesystem::path& target, bool prefer_image) {
  if (draft != "default") return draft;
  const std::filesystem::path path = runtime::runnable_model("default", prefer_image).path;
  const auto same = [&](const std::filesystem::path& p) {
    std::error_code ec;
    return std::filesystem::equivalent(target, p, ec) && !ec;
  };
  bool itself = same(path);
  const char* env = std::getenv("KESTREL_MODEL");
  if (env == nullptr || *env == '\0') {  // the default model in its other form (cached image, GGUF) too
    itself = itself || same(runtime::default_image_path());
    try {
      itself = itself || same(runtime::default_model_path());
    } catch (const Error&) {
      // no default GGUF installed
    }
  }
  if (itself) {
    throw UsageError("--draft default names the default model (" + path.string() +
                     "), which is the model itself: a draft model must be a smaller model with the same vocabulary "
                     "(--draft IMAGE); --draft auto or ngram drafts without one");
  }
  return path.string();
}

void load_draft_model(runtime::Engine& engine, const std::string& draft, const ModelOptions& model) {
  if (runtime::parse_draft_mode(draft) != runtime::DraftMode::kModel) return;
  const std::string path = draft_model_argument(draft, model.resolve().path, model.precision == "auto");
  runtime::EngineOptions o = model.engine_options();
  o.head = runtime::HeadMode::kAuto;
  o.probes = 0;
  engine.load_draft_model(path, o);
}

void SamplingOptions::load_draft(runtime::Engine& engine, const ModelOptions& model) const {
  load_draft_model(engine, draft, model);
}

runtime::GenerateOptions SamplingOptions::generate_options() const {
  runtime::GenerateOptions o;
  o.max_tokens = n_predict;
  o.sampler = sampler;
  o.sampler.seed = seed < 0 ? std::random_device{}() : static_cast<uint64_t>(seed);
  o.ignore_eos = ignore_eos;
  o.stop = stop;
  o.draft = runtime::parse_draft_mode(draft);
  o.draft_max = draft_max;
  o.draft_accept = runtime::parse_draft_accept(draft_accept);
  o.logit_bias = parse_logit_bias(logit_bias);
  return o;
}

std::pair<runtime::TokenId, float> parse_logit_bias_value(const std::string& spec) {
  const size_t sign = spec.find_first_of("+-", 1);
  const std::string id = spec.substr(0, sign);
  const bool id_ok = !id.empty() && id.size() <= 9 && id.find_first_not_of("0123456789") == std::string::npos;
  char* end = nullptr;
  const float bias = sign == std::string::npos ? NAN : std::strtof(spec.c_str() + sign, &end);
  if (!id_ok || end == nullptr || *end != '\0' || !(bias >= -100.0f && bias <= 100.0f)) {
    throw Error("'" + spec + "' is not TOKEN_ID+BIAS or TOKEN_ID-BIAS with a bias in [-100, 100] (506-100 bans "
                "token 506)");
  }
  return {static_cast<runtime::TokenId>(std::stol(id)), bias};
}

std::vector<std::pair<runtime::TokenId, float>> parse_logit_bias(const std::vector<std::string>& specs) {
  std::vector<std::pair<runtime::TokenId, float>> out;
  for (const std::string& spec : specs) out.push_back(parse_logit_bias_value(spec));
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i].first == out[i - 1].first) {
      throw Error("--logit-bias names token " + std::to_string(out[i].first) + " twice");
    }
  }
  return out;
}

}  // namespace kestrel::tools
