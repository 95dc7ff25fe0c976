// kestrel export-tokenizer: a Hugging Face tokenizer directory from a model file.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/runtime/model_path.h"
#include "kestrel/text/hf_tokenizer_export.h"
#include "option_checks.h"

namespace kestrel::tools {
namespace {

struct ExportOptions {
  std::string model = "default";
  std::string out;
  size_t max_length = 0;
};

int export_tokenizer(const ExportOptions& o) {
  const std::filesystem::path path =
      runtime::model_path_argument(o.model);
  const gguf::File file = gguf::File::open(path);
  size_t max_length = o.max_length;
  if (max_length == 0) {
    const std::string arch = file.find_string("general.architecture").value_or("");
    max_length = file.find_uint(arch + ".context_length").value_or(8192);
  }
  text::export_hf_tokenizer(file, o.out, max_length);
  std::fprintf(stderr, "kestrel: wrote tokenizer.json, tokenizer_config.json, special_tokens_map.json to %s\n",
               o.out.c_str());
  return 0;
}

}  // namespace

Command add_export_tokenizer_command(CLI::App& app) {
  auto opts = std::make_shared<ExportOptions>();
  auto* cmd = app.add_subcommand("export-tokenizer",
                                 "Write a Hugging Face tokenizer directory that tokenizes exactly as Kestrel");
  cmd->add_option("model", opts->model, "GGUF model or Kestrel image ('default': the default model)")
      ->capture_default_str();
  cmd->add_option("-o,--output", opts->out, "Output directory (created)")->required();
  cmd->add_option("--model-max-length", opts->max_length, "model_max_length (default: the model's context)")
      ->check(integer_range(size_t{0}, size_t{1} << 40));
  return [opts] { return export_tokenizer(*opts); };
}

}  // namespace kestrel::tools
