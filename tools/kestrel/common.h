// Options shared by the subcommands that load a model and generate.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kestrel/base/error.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/model_path.h"

namespace kestrel::tools {

/// Help groups (`--help` lists a command's own options first, under "Options"; then these).
inline constexpr const char* kModelGroup = "Model loading";
inline constexpr const char* kSamplingGroup = "Sampling";
inline constexpr const char* kDraftGroup = "Speculative decoding";

struct ModelOptions {
  std::string model;  // empty: the default model
  int threads = 0;
  std::optional<size_t> ctx;
  std::string precision = "auto";
  size_t group_size = 32;
  std::string head = "auto";
  size_t probes = 0;
  std::string flashhead_proof = "off";  // --flashhead-proof
  std::string decode_act = "auto";  // kernels::parse_decode_activations
  std::string cache_type_k = "f16";  // --cache-type-k / -ctk (kernels::parse_kv_type)
  std::string cache_type_v = "f16";  // --cache-type-v / -ctv
  std::string kernels;  // --kernels (kernels/kernel_options.h)
  bool no_image_cache = false;  // --no-image-cache (runtime/image_cache.h)
  /// What the last load() found in the GGUF image cache: "hit", "written" or "off"
  /// (runtime::image_cache_status_name), for `--json`.
  mutable std::string image_cache = "off";

  /// Adds -m (in the command's own options) and the loading options (kModelGroup).
  void add_to(CLI::App& cmd);
  runtime::EngineOptions engine_options() const;
  /// The file to load (runtime::runnable_model: "default" is the cached default image when it
  /// exists and the precision is "auto"). Throws kestrel::Error for a directory.
  runtime::RunnableModel resolve() const;
  /// Whether loading `m` should print the one-line hint about the default image.
  bool hint_wanted(const runtime::RunnableModel& m) const;
  /// Loads resolve()'s model; the default image falls back to the default GGUF, with a warning,
  /// when it does not load. A GGUF at --precision auto runs from its cached image
  /// (runtime/image_cache.h: written on the first run, saying so on stderr; one that does not
  /// load is written again, with a warning) unless the cache is off.
  runtime::Engine load() const;
  /// As load(), on the heap (an Engine cannot be moved), for the server's background load.
  std::unique_ptr<runtime::Engine> load_unique() const;
};

/// Adds --kernels, the process's kernel switches (kernels/kernel_options.h), setting `value`.
CLI::Option* add_kernels_option(CLI::App& cmd, std::string& value);

/// Reads the environment's kernel switches and applies `value` (--kernels; "" : none) on top, for
/// the whole process. Throws kestrel::Error for a bad KESTREL_KERNELS or `value`. Call before a load.
void apply_kernels_option(const std::string& value);

/// Adds the option `name` (--decode-act) that sets `value` to auto, bf16 or int8, for the model
/// named by `whose` ("" : the model of the command). `source_option` is the option that loads a
/// GGUF in its float32 source form, on which the option has no effect ("": the command has none).
CLI::Option* add_decode_act_option(CLI::App& cmd, const std::string& name, std::string& value,
                                   const std::string& whose = "",
                                   const std::string& source_option = "--precision source");

/// Adds --cache-type-k and --cache-type-v (llama.cpp's names; main() maps its short forms -ctk and
/// -ctv onto them) to `cmd`'s model-loading group: the KV cache's element types, f16 (default),
/// bf16 or q8 (q8_0 accepted).
void add_kv_cache_options(CLI::App& cmd, std::string& k, std::string& v);
/// The model::KvTypes those options name (for A/B measurements, KESTREL_KV_HADAMARD=1: q8 heads
/// rotated). Throws kestrel::Error for a bad name.
model::KvTypes kv_types_of(const std::string& k, const std::string& v);

/// The text of the file `path`, or of standard input for "-": a regular file, or a pipe, FIFO or
/// other file that is read to its end (`-f <(cmd)`, `-f /dev/stdin`). Throws kestrel::Error naming
/// the file and the reason when it cannot be read (missing, a directory, ...) or has more than
/// `max_bytes` bytes (`what`: the files limited, as the message names them, e.g. "prompt files").
std::string read_input_file(const std::string& path, uintmax_t max_bytes = UINTMAX_MAX,
                            const std::string& what = "input files");

/// A usage error found after the options parsed (the CLI exits with status 2, as for a bad option).
class UsageError : public Error {
 public:
  using Error::Error;
};

/// The --draft value with "default" replaced by the default model's file, as -m default finds it
/// (runtime::runnable_model: the cached default image when it exists and `prefer_image`, else the
/// default GGUF); other values are returned as they are. Throws UsageError when "default" names
/// the model `target` itself (the default model in either form: drafting for itself is only extra
/// work), kestrel::Error as runtime::default_model_path() when the default model is missing.
std::string draft_model_argument(const std::string& draft, const std::filesystem::path& target, bool prefer_image);

/// With `draft` naming a model file (--draft IMAGE, or default: draft_model_argument): loads it
/// as `engine`'s draft model with the target's load precision (the draft's own head and probes).
/// Throws runtime::VocabularyMismatch or UsageError (the CLI exits with status 2), or kestrel::Error.
void load_draft_model(runtime::Engine& engine, const std::string& draft, const ModelOptions& model);

/// The help text of --draft-accept.
extern const char* const kDraftAcceptHelp;

struct SamplingOptions {
  runtime::SamplerConfig sampler;
  int64_t seed = -1;  // -1: random
  size_t n_predict = 256;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  std::string draft = "auto";
  size_t draft_max = runtime::kMaxDraft;
  std::string draft_accept = "exact";
  std::vector<std::string> logit_bias;  // --logit-bias TOKEN_ID(+|-)BIAS, as llama.cpp's -l

  /// Adds -n (in the command's own options), the sampling options (kSamplingGroup) and the
  /// speculative decoding ones (kDraftGroup).
  void add_to(CLI::App& cmd);
  runtime::GenerateOptions generate_options() const;
  /// With --draft IMAGE: loads it as `engine`'s draft model (load_draft_model).
  void load_draft(runtime::Engine& engine, const ModelOptions& model) const;
};

/// One --logit-bias value, "506-100" or "1234+2.5", as (token, bias). Throws kestrel::Error for
/// a malformed value or a bias outside [-100, 100].
std::pair<runtime::TokenId, float> parse_logit_bias_value(const std::string& spec);
/// --logit-bias values as (token, bias) pairs, ids ascending. Throws kestrel::Error as
/// parse_logit_bias_value does, or for a token named twice.
std::vector<std::pair<runtime::TokenId, float>> parse_logit_bias(const std::vector<std::string>& specs);

}  // namespace kestrel::tools
