// kestrel export: a Kestrel image as a Hugging Face directory for vLLM, SGLang and
// transformers (compressed-tensors W4A16), docs/export.md.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "commands.h"
#include "partial_file.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/base/error.h"
#include "kestrel/image/hf_export.h"
#include "kestrel/runtime/model_path.h"
#include "option_checks.h"

namespace kestrel::tools {
namespace {

struct ExportCommandOptions {
  std::string image;
  std::string out;
  bool requantize = false;
  std::string dtype = "bfloat16";
  bool flashhead = false;
  bool force = false;
  int threads = 0;
};

// IMAGE as run takes -m: "default" is the default model's cached image (`kestrel build default
// --as-default`), or $KESTREL_MODEL when set. export reads images, never the default GGUF.
std::filesystem::path image_argument(const std::string& arg) {
  if (arg != "default") return arg;
  if (const char* env = std::getenv("KESTREL_MODEL"); env != nullptr && *env != '\0') return runtime::default_model_path();
  const auto path = runtime::default_image_path();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error("no default image at " + path.string() +
                " (kestrel export reads images): build it with `kestrel build default --as-default --zero-points int` "
                "(integer zero points export exactly), or give an image file");
  }
  return path;
}

int export_image(const ExportCommandOptions& o) {
  image::HfExportOptions options;
  options.requantize = o.requantize;
  options.float32 = o.dtype == "float32";
  options.flashhead = o.flashhead;
  options.force = o.force;
  options.log = [](const std::string& m) { std::fprintf(stderr, "kestrel export: %s\n", m.c_str()); };
  ThreadPool pool(o.threads);
  const std::string image = image_argument(o.image).string();
  remove_partial_on_signal((std::filesystem::path(o.out) / "model.safetensors").string());
  const auto r = image::export_hf(image, o.out, options, pool);
  std::string exactness = ", exact";
  if (r.requantized_groups > 0) {
    exactness = ", ";
    exactness += std::to_string(r.requantized_groups);
    exactness += " requantized";
  }
  if (r.int4_matrices == 0) {
    std::printf("exported %s to %s: a dense checkpoint (no INT4 matrices), %zu layer matrices, %s\n", image.c_str(),
                o.out.c_str(), r.dense_matrices, o.dtype.c_str());
  } else {
    std::printf("exported %s to %s: %zu INT4 matrices (compressed-tensors pack-quantized, %zu groups%s), "
                "%zu layer matrices kept dense, %s for the rest\n",
                image.c_str(), o.out.c_str(), r.int4_matrices, r.total_groups, exactness.c_str(), r.dense_matrices,
                o.dtype.c_str());
  }
  if (r.flashhead_clusters > 0) {
    std::printf("FlashHead: %zu clusters in flash_head/clustering_cache.safetensors for the flash-head vLLM plugin "
                "(CUDA only, batch 1, greedy: docs/export.md)\n", r.flashhead_clusters);
  }
  return 0;
}

}  // namespace

Command add_export_command(CLI::App& app) {
  auto o = std::make_shared<ExportCommandOptions>();
  auto* cmd = app.add_subcommand(
      "export", "Write a Kestrel image as a Hugging Face directory (compressed-tensors W4A16) for vLLM, SGLang, transformers");
  cmd->add_option("image", o->image,
                  "Kestrel image (.kimg) of a Gemma 3 or Gemma 4 model ('default': the default model's cached image, "
                  "as run uses it)")
      ->required();
  cmd->add_option("-o,--output", o->out,
                  "Output directory (created; the files the export writes are replaced; refused if it holds other "
                  "weight files, unless --force)")
      ->required();
  cmd->add_flag("--force", o->force,
                "Remove weight files in the output directory that the export does not write (other *.safetensors, "
                "*.safetensors.index.json, pytorch_model*.bin) instead of refusing it");
  cmd->add_flag("--requantize", o->requantize,
                "Requantize the INT4 groups compressed-tensors cannot store exactly (a free float minimum, 8-bit "
                "group parameters) instead of refusing the image");
  cmd->add_flag("--flashhead", o->flashhead,
                "Also write the image's FlashHead clustering for the flash-head vLLM plugin (flash_head/, config.json "
                "flash_head_cache_dir; CUDA only, batch 1, greedy)");
  cmd->add_option("--dtype", o->dtype, "dtype of the tensors that are not INT4 (embedding, norms, matrices kept above 4 bits)")
      ->check(CLI::IsMember({"bfloat16", "float32"}))
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: every core)")
      ->check(integer_range(0, ThreadPool::kMaxThreads));
  return [o] { return export_image(*o); };
}

}  // namespace kestrel::tools
