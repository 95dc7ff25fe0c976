// `kestrel export`: a Kestrel image as a Hugging Face checkpoint directory that vLLM, SGLang
// and transformers load, with the INT4 layer matrices in compressed-tensors' W4A16
// "pack-quantized" format (quant/compressed_tensors.h) carrying the image's own codes and
// scales (docs/export.md).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"

namespace kestrel::image {

/// The image holds INT4 groups compressed-tensors cannot represent exactly (a free float
/// minimum that is not d times an integer zero point, or 8-bit group parameters), and
/// requantization was not asked for.
class InexactExportError : public Error {
 public:
  using Error::Error;
};

struct HfExportOptions {
  /// Requantize the groups that are not exactly representable (from the image's dequantized
  /// weights, with integer zero points) instead of refusing the image.
  bool requantize = false;
  /// dtype of the tensors that are not INT4 (embedding, norms, matrices kept above 4 bits):
  /// bfloat16 (the Gemma checkpoints' dtype) or float32 (exact for every stored value).
  bool float32 = false;
  /// Also write the image's FlashHead clustering for the `flash-head` vLLM plugin (Embedl,
  /// PyPI flash-head 0.1.10): flash_head/clustering_cache.safetensors with `centroids` float32
  /// [d_model, clusters] and `cluster_assignments` int64 [vocab] (each token's cluster), and
  /// config.json's flash_head_cache_dir, flash_head_special_token_ids and n_probes. The image
  /// must have been built with --flashhead.
  bool flashhead = false;
  /// Remove weight files in DIR that the export does not write (other *.safetensors, a
  /// *.safetensors.index.json, pytorch_model*.bin) instead of refusing the directory: vLLM and
  /// transformers would load them with (or instead of) the export's model.safetensors.
  bool force = false;
  /// Notes (requantized matrices, ignored layers, removed files); optional.
  std::function<void(const std::string&)> log;
};

struct HfExportReport {
  size_t int4_matrices = 0;        // written as compressed-tensors pack-quantized
  size_t dense_matrices = 0;       // layer matrices kept above 4 bits (listed in `ignore`)
  size_t requantized_matrices = 0;
  size_t requantized_groups = 0;   // of the groups in the requantized matrices
  size_t total_groups = 0;         // INT4 groups written
  std::vector<std::string> ignored;  // quantization_config.ignore
  size_t flashhead_clusters = 0;     // written for the flash-head plugin (0: none)
};

/// Writes DIR (created; the files the export writes are replaced): config.json (Gemma3ForCausalLM, model_type
/// gemma3_text, or for a Gemma 4 image the text model Gemma4ForCausalLM, model_type
/// gemma4_text; with quantization_config for a w4a16 image), model.safetensors,
/// generation_config.json, tokenizer.json / tokenizer_config.json / special_tokens_map.json /
/// chat_template.jinja, the image's licence / NOTICE texts, and kestrel_export.json
/// (provenance). `image_path` must be a Kestrel image (docs/image-format.md) of a Gemma 3 or
/// Gemma 4 model; its content checksum is verified first.
/// Throws InexactExportError (nothing written) when groups are not exactly representable and
/// options.requantize is false; kestrel::Error (nothing written) for a file that is not an
/// image, DIR holding weight files the export does not write (unless options.force),
/// options.flashhead for an image without FlashHead, a corrupt image, an architecture other than gemma3 / gemma4, or a Gemma 4
/// configuration transformers' Gemma4TextConfig cannot express (image/hf_export_config.h).
HfExportReport export_hf(const std::filesystem::path& image_path, const std::filesystem::path& dir,
                         const HfExportOptions& options, ThreadPool& pool);

}  // namespace kestrel::image
