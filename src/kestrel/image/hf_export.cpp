#include "kestrel/image/hf_export.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "kestrel/formats/dequant.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/formats/safetensors_writer.h"
#include "kestrel/head/flashhead_format.h"
#include "kestrel/image/builder.h"
#include "kestrel/image/hf_export_config.h"
#include "kestrel/image/image.h"
#include "kestrel/image/int4_tensors.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/quant/compressed_tensors.h"
#include "kestrel/quant/w4.h"
#include "kestrel/text/hf_tokenizer_export.h"

namespace kestrel::image {
namespace {

using gguf::TensorType;
using nlohmann::json;
namespace st = safetensors;

bool ends_with(const std::string& s, const char* suffix) {
  const size_t k = std::strlen(suffix);
  return s.size() >= k && s.compare(s.size() - k, k, suffix) == 0;
}

// The HF module of a GGUF tensor ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj")
// in transformers' Gemma3ForCausalLM or (gemma4) Gemma4ForCausalLM; empty when it is not part
// of the text model. Gemma 4's layer_output_scale is the layer's `layer_scalar` buffer.
std::string hf_module(const std::string& name, bool gemma4) {
  static const std::map<std::string, std::string> kLayer = {
      {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"}, {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},
      {"attn_norm", "input_layernorm"}, {"post_attention_norm", "post_attention_layernorm"},
      {"ffn_norm", "pre_feedforward_layernorm"}, {"post_ffw_norm", "post_feedforward_layernorm"},
      {"ffn_gate", "mlp.gate_proj"}, {"ffn_up", "mlp.up_proj"}, {"ffn_down", "mlp.down_proj"}};
  // Gemma 4's per-layer embeddings (PLE) and layer scalars (HF Gemma4TextDecoderLayer).
  static const std::map<std::string, std::string> kGemma4Layer = {
      {"inp_gate", "per_layer_input_gate"}, {"proj", "per_layer_projection"},
      {"post_norm", "post_per_layer_input_norm"}, {"layer_output_scale", "layer_scalar"}};
  static const std::map<std::string, std::string> kGemma4Global = {
      {"per_layer_token_embd.weight", "model.embed_tokens_per_layer"},
      {"per_layer_model_proj.weight", "model.per_layer_model_projection"},
      {"per_layer_proj_norm.weight", "model.per_layer_projection_norm"}};
  if (name == "token_embd.weight") return "model.embed_tokens";
  if (name == "output_norm.weight") return "model.norm";
  if (name == "output.weight") return "lm_head";
  if (gemma4) {
    if (const auto g = kGemma4Global.find(name); g != kGemma4Global.end()) return g->second;
  }
  if (name.rfind("blk.", 0) != 0 || !ends_with(name, ".weight")) return "";
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos) return "";
  const std::string layer = name.substr(4, dot - 4);
  const std::string part = name.substr(dot + 1, name.size() - dot - 1 - std::strlen(".weight"));
  std::string module;
  if (const auto it = kLayer.find(part); it != kLayer.end()) {
    module = it->second;
  } else if (const auto g = kGemma4Layer.find(part); gemma4 && g != kGemma4Layer.end()) {
    module = g->second;
  }
  const bool digits = !layer.empty() && std::all_of(layer.begin(), layer.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || module.empty()) return "";
  return "model.layers." + layer + "." + module;
}

// An INT4 matrix of the image (NAME.q4, NAME.scales, NAME.mins / NAME.row_scales, or the int8
// layout's NAME.q4i8 and siblings, de-interleaved into `owned`) in matmul.h's row-major layout.
kernels::Matrix int4_matrix(const gguf::File& f, const std::string& base, const ImageInfo& info,
                            quant::W4Matrix& owned) {
  return int4_rows(f, base, info, owned);
}

// Which groups of an INT4 matrix compressed-tensors represents exactly (1) or not (0).
std::vector<char> exact_groups(const kernels::Matrix& m) {
  const size_t n = m.rows * m.cols / m.group_size;
  if (m.scales8 != nullptr) return std::vector<char>(n, 0);  // 8-bit parameters: d_row * s_g, -m_row * n_g
  std::vector<char> exact(n, 1);
  if (m.mins == nullptr) return exact;  // symmetric: w = d (q - 8)
  for (size_t i = 0; i < n; ++i) exact[i] = quant::integer_zero_point(m.scales[i], m.mins[i]).has_value();
  return exact;
}

// An INT4 matrix in compressed-tensors' terms: codes (kW4 layout), fp16 scales, zero points
// (0..15; empty when symmetric).
struct CtMatrix {
  std::vector<uint8_t> codes;
  std::vector<uint16_t> scales;
  std::vector<uint8_t> zeros;
  size_t requantized_groups = 0;
};

CtMatrix to_ct(const kernels::Matrix& m, bool symmetric, ThreadPool& pool) {
  const size_t G = m.group_size, n_groups = m.rows * m.cols / G;
  CtMatrix out;
  const auto* codes = static_cast<const uint8_t*>(m.data);
  out.codes.assign(codes, codes + m.rows * m.cols / 2);
  const std::vector<char> exact = exact_groups(m);
  if (m.scales != nullptr) out.scales.assign(m.scales, m.scales + n_groups);
  else out.scales.assign(n_groups, 0);
  if (!symmetric) {
    out.zeros.assign(n_groups, 0);
    for (size_t i = 0; i < n_groups; ++i) {
      if (exact[i]) out.zeros[i] = static_cast<uint8_t>(*quant::integer_zero_point(m.scales[i], m.mins[i]));
    }
  }
  out.requantized_groups = static_cast<size_t>(std::count(exact.begin(), exact.end(), 0));
  if (out.requantized_groups == 0) return out;
  // Requantize from the image's own weights (what Kestrel computes), integer zero points;
  // the exact groups keep their codes and scales.
  std::vector<float> dense(m.rows * m.cols);
  for (size_t r = 0; r < m.rows; ++r) kernels::matrix_row(m, r, dense.data() + r * m.cols);
  const quant::W4Matrix q = quant::quantize_w4(dense.data(), m.rows, m.cols, G, nullptr, true, pool, false, true);
  for (size_t i = 0; i < n_groups; ++i) {
    if (exact[i]) continue;
    std::memcpy(&out.codes[i * G / 2], &q.qs[i * G / 2], G / 2);
    out.scales[i] = q.scales[i];
    const auto z = quant::integer_zero_point(q.scales[i], q.mins[i]);
    if (!z) throw Error("internal: the integer-zero-point fit of " + std::to_string(i) + " is not exact");
    out.zeros[i] = static_cast<uint8_t>(*z);
  }
  return out;
}

// Row r of a 2-D image tensor (INT4 or any GGUF type) as float32 [cols].
class RowReader {
 public:
  RowReader(const gguf::File& f, const std::string& name, const ImageInfo& info) {
    if (const auto* t = f.find_tensor(name)) {
      t_ = t;
      data_ = f.tensor_data(*t).data();
      cols_ = t->shape[0];
      rows_ = t->rows();
      row_bytes_ = gguf::row_bytes(t->type, cols_);
    } else {
      m_ = int4_matrix(f, name, info, owned_);
      cols_ = m_.cols;
      rows_ = m_.rows;
    }
  }
  size_t rows() const { return rows_; }
  size_t cols() const { return cols_; }
  void row(size_t r, float* out) const {
    if (t_ != nullptr) gguf::dequantize(t_->type, data_ + r * row_bytes_, out, cols_);
    else kernels::matrix_row(m_, r, out);
  }

  RowReader(const RowReader&) = delete;  // m_ may point into owned_
  RowReader& operator=(const RowReader&) = delete;

 private:
  const gguf::TensorInfo* t_ = nullptr;
  const std::byte* data_ = nullptr;
  kernels::Matrix m_;
  quant::W4Matrix owned_;  // m_'s arrays where the image holds the int8 layout
  size_t rows_ = 0, cols_ = 0;
  uint64_t row_bytes_ = 0;
};

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

// Writes float32 values as the export's dense dtype.
void write_dense(st::Writer& w, const float* x, size_t n, bool float32) {
  if (float32) {
    w.write({reinterpret_cast<const std::byte*>(x), n * sizeof(float)});
    return;
  }
  std::vector<uint16_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = gguf::fp32_to_bf16(x[i]);
  w.write(bytes_of(b));
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw Error("cannot write " + path.string());
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

// The image's kestrel.license.text ("==> NAME <==" sections) as files of DIR; a section whose
// name is not a plain file name, or text without sections, goes to NOTICE.kestrel.
std::vector<std::string> write_licenses(const std::string& text, const std::filesystem::path& dir) {
  std::vector<std::string> written;
  if (text.empty()) return written;
  std::vector<std::pair<std::string, std::string>> sections;
  size_t pos = 0;
  while (pos < text.size()) {
    if (text.compare(pos, 4, "==> ") == 0) {
      const size_t end = text.find(" <==\n", pos);
      if (end != std::string::npos) {
        const std::string name = text.substr(pos + 4, end - pos - 4);
        const size_t body = end + 5;
        size_t next = text.find("\n==> ", body);
        next = next == std::string::npos ? text.size() : next + 1;
        std::string content = text.substr(body, next - body);
        if (!content.empty() && content.back() == '\n') content.pop_back();  // the separator the build added
        sections.emplace_back(name, content);
        pos = next;
        continue;
      }
    }
    sections.clear();
    sections.emplace_back("NOTICE.kestrel", text);
    break;
  }
  for (auto& [name, content] : sections) {
    const bool plain = !name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
                       name.find_first_of("\\\n\r") == std::string::npos;
    std::string file = plain ? name : "NOTICE.kestrel";
    if (std::find(written.begin(), written.end(), file) != written.end()) file += ".2";
    write_text(dir / file, content);
    written.push_back(file);
  }
  return written;
}

// Where --flashhead puts the clustering (config.json's flash_head_cache_dir, relative to DIR).
constexpr const char* kFlashHeadDir = "flash_head";
constexpr const char* kFlashHeadFile = "clustering_cache.safetensors";

// The image's FlashHead clustering as the flash-head vLLM plugin reads it
// (flash_head/flash_head.py, _get_centroids and get_flash_head_parameters, version 0.1.10):
// `centroids` [d_model, clusters], whose column k is cluster k's centroid (the plugin scores
// clusters by h . c_k / |c_k|), and `cluster_assignments` [vocab], token t's cluster. Kestrel's
// image stores the head's rows in cluster order (row r holds token row_tokens[r], cluster
// r / cluster_size) and the centroids Q8_0, one row of d_model per cluster: written float32,
// the dequantized values exactly. Returns the number of clusters.
size_t write_flashhead_cache(const gguf::File& f, const std::filesystem::path& cache_dir) {
  const auto& rt = f.tensor(head::kRowTokensTensor);
  const auto& ct = f.tensor(head::kCentroidsTensor);
  const size_t vocab = rt.n_elements, d = ct.shape[0], clusters = ct.rows();
  const uint64_t cluster_size = f.get_uint(head::keys::kClusterSize);
  if (ct.shape.size() != 2 || clusters == 0 || cluster_size * clusters != vocab) {
    throw Error("image: flashhead.centroids / cluster_size do not match flashhead.row_tokens");
  }
  std::vector<float> row(d);
  std::vector<float> centroids(d * clusters);
  const auto* data = f.tensor_data(ct).data();
  const uint64_t row_bytes = gguf::row_bytes(ct.type, d);
  for (size_t k = 0; k < clusters; ++k) {
    gguf::dequantize(ct.type, data + k * row_bytes, row.data(), d);
    for (size_t j = 0; j < d; ++j) centroids[j * clusters + k] = row[j];
  }
  std::vector<int64_t> assignment(vocab, -1);
  const auto* tokens = reinterpret_cast<const int32_t*>(f.tensor_data(rt).data());
  for (size_t r = 0; r < vocab; ++r) assignment[static_cast<size_t>(tokens[r])] = static_cast<int64_t>(r / cluster_size);
  if (std::count(assignment.begin(), assignment.end(), -1) != 0) throw Error("image: flashhead.row_tokens is not a permutation");
  std::error_code ec;
  std::filesystem::create_directories(cache_dir, ec);
  if (ec) throw Error("cannot create " + cache_dir.string() + ": " + ec.message());
  const auto partial = cache_dir / (std::string(kFlashHeadFile) + ".partial");
  {
    st::Writer w(partial);
    w.set_metadata({{"format", "pt"}, {"producer", std::string("kestrel ") + KESTREL_VERSION}});
    w.add_tensor("centroids", st::Dtype::kF32, {d, clusters});
    w.add_tensor("cluster_assignments", st::Dtype::kI64, {vocab});
    w.begin_data();
    w.write(bytes_of(centroids));
    w.write(bytes_of(assignment));
    w.finish();
  }
  std::filesystem::rename(partial, cache_dir / kFlashHeadFile);
  return clusters;
}

// Weight files in DIR that loaders would read with the export's and that the export does not
// write: *.safetensors other than model.safetensors, *.safetensors.index.json (transformers and
// vLLM read the index instead of model.safetensors), pytorch_model*.bin (and its index). Entries
// that are not files count too (a directory named x.safetensors: a loader globbing *.safetensors
// fails on it), model.safetensors among them.
std::vector<std::filesystem::path> stray_weight_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> stray;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return stray;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "model.safetensors" && entry.is_regular_file(ec)) continue;
    if (ends_with(name, ".safetensors") || ends_with(name, ".safetensors.index.json") ||
        (name.rfind("pytorch_model", 0) == 0 && (ends_with(name, ".bin") || ends_with(name, ".bin.index.json")))) {
      stray.push_back(entry.path());
    }
  }
  std::sort(stray.begin(), stray.end());
  return stray;
}

struct Item {
  std::string name;    // GGUF name (without .q4)
  std::string module;  // HF module
  std::string hf;      // HF tensor of a dense or norm item (module + ".weight"; Gemma 4's layer_scalar as is)
  enum class Kind { kInt4, kDense, kNorm } kind = Kind::kDense;
  size_t rows = 0, cols = 0;  // HF [rows, cols]; norms: cols values
};

}  // namespace

HfExportReport export_hf(const std::filesystem::path& image_path, const std::filesystem::path& dir,
                         const HfExportOptions& options, ThreadPool& pool) {
  const gguf::File f = gguf::File::open(image_path);
  const auto info = read_image_info(f);
  if (!info) {
    throw Error(image_path.string() + " is not a Kestrel image (kestrel export reads images: `kestrel build` one first)");
  }
  verify_content(f);
  const std::string arch = f.get_string("general.architecture");
  if (arch != "gemma3" && arch != "gemma4") {
    throw Error("kestrel export writes Gemma 3 and Gemma 4 images; " + image_path.string() + " is '" + arch + "'");
  }
  const bool gemma4 = arch == "gemma4";
  const bool w4 = info->precision == quant::Precision::kW4A16;
  const size_t group = w4 ? info->group_size : 0;
  const bool symmetric = w4 && !info->zero_points;

  // Plan every tensor; check exactness before anything is written.
  std::vector<Item> items;
  HfExportReport report;
  std::vector<std::string> inexact;
  size_t inexact_groups = 0;
  size_t assistant_tensors = 0;
  for (const auto& t : f.tensors()) {
    std::string name = t.name;
    if (name.rfind("mtp.", 0) == 0) {  // a Gemma 4 MTP assistant: a checkpoint of its own in transformers
      ++assistant_tensors;
      continue;
    }
    Item it;
    if (const std::string base = int4_base(name); !base.empty()) {
      const bool int8_layout = base.size() + std::strlen(kInt8CodesSuffix) == name.size();
      name = base;
      it.kind = Item::Kind::kInt4;
      // {cols/2, rows}, or the int8 layout's {64, cols/8, rows/16}
      it.rows = int8_layout ? t.shape.at(2) * 16 : t.shape.at(1);
      it.cols = int8_layout ? t.shape[1] * 8 : t.shape[0] * 2;
    } else if (is_int4_params_tensor(name) || name.rfind("flashhead.", 0) == 0 || (gemma4 && name == "rope_freqs.weight")) {
      continue;  // rope_freqs: Gemma 4's partial RoPE, written as config.json's rope_parameters
    } else if (t.shape.size() == 1) {
      it.kind = Item::Kind::kNorm;
      it.cols = t.shape[0];
    } else {
      it.rows = t.rows();
      it.cols = t.shape[0];
    }
    it.name = name;
    it.module = hf_module(name, gemma4);
    if (it.module.empty()) {
      throw Error("image tensor '" + t.name + "' is not part of a " + (gemma4 ? "Gemma 4" : "Gemma 3") + " text model");
    }
    it.hf = ends_with(it.module, ".layer_scalar") ? it.module : it.module + ".weight";
    const bool layer_matrix = name.rfind("blk.", 0) == 0 && it.kind != Item::Kind::kNorm;
    // Gemma 4's per-layer model projection is a Linear outside the layers, kept dense.
    const bool global_linear = name == "per_layer_model_proj.weight";
    if (global_linear && w4) report.ignored.push_back(it.module);
    if (it.kind == Item::Kind::kInt4 && !layer_matrix) it.kind = Item::Kind::kDense;  // an INT4 embedding
    if (it.kind == Item::Kind::kInt4) {
      quant::W4Matrix owned;
      const auto e = exact_groups(int4_matrix(f, name, *info, owned));
      const auto bad = static_cast<size_t>(std::count(e.begin(), e.end(), 0));
      if (bad > 0) {
        inexact.push_back(name);
        inexact_groups += bad;
      }
      report.total_groups += e.size();
    } else if (layer_matrix && w4) {
      report.ignored.push_back(it.module);  // kept above 4 bits (--tensor-type)
    }
    items.push_back(std::move(it));
  }
  if (assistant_tensors > 0 && options.log) {
    options.log("the image's MTP assistant (" + std::to_string(assistant_tensors) +
                " tensors) is not exported: transformers and vLLM read it as a checkpoint of its own");
  }
  if (!inexact.empty() && !options.requantize) {
    throw InexactExportError(
        image_path.string() + ": " + std::to_string(inexact_groups) + " of " + std::to_string(report.total_groups) +
        " INT4 groups (in " + std::to_string(inexact.size()) + " matrices, e.g. " + inexact.front() +
        ") have a minimum that is not the scale times an integer zero point" +
        (info->scale_bits == 8 ? " (8-bit group parameters)" : "") +
        ", which compressed-tensors cannot store exactly. Build the image with --zero-points int (or "
        "--symmetric), or pass --requantize to requantize those groups from the image's weights");
  }
  const bool has_output = f.find_tensor("output.weight") != nullptr || has_int4(f, "output.weight");
  // The output head (tied to the embedding, or output.weight) is written dense either way.
  if (w4) report.ignored.insert(report.ignored.begin(), "lm_head");

  // FlashHead images keep the head's rows in cluster order: map them back to token order.
  std::vector<int32_t> row_of_token;
  if (const auto* rt = f.find_tensor(head::kRowTokensTensor)) {
    const auto* tokens = reinterpret_cast<const int32_t*>(f.tensor_data(*rt).data());
    row_of_token.assign(rt->n_elements, -1);
    for (size_t r = 0; r < rt->n_elements; ++r) {
      if (tokens[r] < 0 || static_cast<size_t>(tokens[r]) >= rt->n_elements) throw Error("image: bad flashhead.row_tokens");
      row_of_token[static_cast<size_t>(tokens[r])] = static_cast<int32_t>(r);
    }
  }
  const std::string head_name = has_output ? "output.weight" : "token_embd.weight";
  if (options.flashhead && row_of_token.empty()) {
    throw Error(image_path.string() + " was not built with --flashhead: it has no clustering to export "
                "(kestrel build ... --flashhead)");
  }

  // Weight files of another checkpoint in DIR would be loaded with the export's.
  const auto stray = stray_weight_files(dir);
  if (!stray.empty() && !options.force) {
    std::string names;
    for (size_t i = 0; i < stray.size() && i < 4; ++i) names += (i ? ", " : "") + stray[i].filename().string();
    if (stray.size() > 4) names += ", ... (" + std::to_string(stray.size()) + " files)";
    throw Error(dir.string() + " holds weight files the export does not write (" + names +
                "), which vLLM and transformers would load with it: export into an empty directory, or pass --force "
                "to remove them");
  }
  // config.json first: a configuration transformers cannot express is refused before anything is written.
  size_t vocab_rows = 0, ple_rows = 0;
  for (const auto& it : items) {
    if (it.name == "token_embd.weight") vocab_rows = it.rows;
    if (it.name == "per_layer_token_embd.weight") ple_rows = it.rows;
  }
  const std::string dtype = options.float32 ? "float32" : "bfloat16";
  const json quant = w4 ? compressed_tensors_config(group, symmetric, report.ignored) : json(nullptr);
  json config;
  if (gemma4) {
    std::vector<float> rope_freqs;
    if (const auto* rf = f.find_tensor("rope_freqs.weight")) {
      rope_freqs.resize(rf->n_elements);
      gguf::dequantize(rf->type, f.tensor_data(*rf).data(), rope_freqs.data(), rope_freqs.size());
    }
    config = gemma4_hf_config(f, rope_freqs, vocab_rows, ple_rows, !has_output, dtype, quant);
  } else {
    config = gemma3_hf_config(f, vocab_rows, !has_output, dtype, quant);
  }
  if (options.flashhead) {
    // The flash-head plugin's keys (flash_head/loading.py: load_flash_head_from_checkpoint): the
    // cache directory relative to the model directory, the tokens always scored, the probes.
    const auto* sp = f.find_tensor(head::kSpecialTokensTensor);
    json special = json::array();
    if (sp != nullptr) {
      const auto* ids = reinterpret_cast<const int32_t*>(f.tensor_data(*sp).data());
      for (size_t i = 0; i < sp->n_elements; ++i) special.push_back(ids[i]);
    }
    config["flash_head_cache_dir"] = kFlashHeadDir;
    config["flash_head_special_token_ids"] = special;
    config["n_probes"] = f.get_uint(head::keys::kProbes);
  }

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create " + dir.string() + ": " + ec.message());

  for (const auto& p : stray) {
    std::error_code rm;
    std::filesystem::remove_all(p, rm);  // a file, or a directory named like one
    if (rm) throw Error("cannot remove " + p.string() + ": " + rm.message());
    if (options.log) options.log("removed " + p.string() + " (--force: a weight file the export does not write)");
  }

  // model.safetensors, written to a .partial file and renamed when complete.
  const st::Dtype dense_dtype = options.float32 ? st::Dtype::kF32 : st::Dtype::kBF16;
  const auto partial = dir / "model.safetensors.partial";
  {
    st::Writer w(partial);
    w.set_metadata({{"format", "pt"}});
    for (const auto& it : items) {
      if (it.kind == Item::Kind::kInt4) {
        w.add_tensor(it.module + ".weight_packed", st::Dtype::kI32, {it.rows, it.cols / 8});
        w.add_tensor(it.module + ".weight_scale", st::Dtype::kF16, {it.rows, it.cols / group});
        if (!symmetric) w.add_tensor(it.module + ".weight_zero_point", st::Dtype::kI32, {(it.rows + 7) / 8, it.cols / group});
        w.add_tensor(it.module + ".weight_shape", st::Dtype::kI64, {2});
      } else if (it.kind == Item::Kind::kNorm) {
        w.add_tensor(it.hf, dense_dtype, {it.cols});
      } else {
        w.add_tensor(it.hf, dense_dtype, {it.rows, it.cols});
      }
    }
    w.begin_data();
    std::vector<float> buf;
    for (const auto& it : items) {
      if (it.kind == Item::Kind::kInt4) {
        quant::W4Matrix owned;
        const CtMatrix m = to_ct(int4_matrix(f, it.name, *info, owned), symmetric, pool);
        if (m.requantized_groups > 0) {
          ++report.requantized_matrices;
          report.requantized_groups += m.requantized_groups;
        }
        w.write(bytes_of(quant::ct::pack_weight(m.codes, it.rows, it.cols, group)));
        w.write(bytes_of(m.scales));
        if (!symmetric) w.write(bytes_of(quant::ct::pack_zero_points(m.zeros, it.rows, it.cols / group)));
        w.write(bytes_of(std::vector<int64_t>{static_cast<int64_t>(it.rows), static_cast<int64_t>(it.cols)}));
        ++report.int4_matrices;
      } else if (it.kind == Item::Kind::kNorm) {
        // Gemma 3's HF RMSNorm multiplies by 1 + w; images store the whole multiplier. Gemma 4's
        // multiplies by w (Gemma4RMSNorm), as stored; its layer scalars too.
        buf.resize(it.cols);
        gguf::dequantize(f.tensor(it.name).type, f.tensor_data(f.tensor(it.name)).data(), buf.data(), it.cols);
        if (!gemma4) {
          for (float& x : buf) x -= 1.0f;
        }
        write_dense(w, buf.data(), it.cols, options.float32);
      } else {
        const RowReader reader(f, it.name, *info);
        const bool permuted = !row_of_token.empty() && it.name == head_name;
        if (permuted && row_of_token.size() != it.rows) throw Error("image: flashhead.row_tokens does not match " + it.name);
        const size_t step = std::max<size_t>(1, (size_t{1} << 20) / it.cols);
        buf.resize(step * it.cols);
        for (size_t r = 0; r < it.rows; r += step) {
          const size_t n = std::min(step, it.rows - r);
          for (size_t k = 0; k < n; ++k) {
            reader.row(permuted ? static_cast<size_t>(row_of_token[r + k]) : r + k, buf.data() + k * it.cols);
          }
          write_dense(w, buf.data(), n * it.cols, options.float32);
        }
        if (it.name.rfind("blk.", 0) == 0) ++report.dense_matrices;
      }
    }
    w.finish();
  }
  std::filesystem::rename(partial, dir / "model.safetensors");
  std::error_code stale_fh;
  std::filesystem::remove(dir / kFlashHeadDir / kFlashHeadFile, stale_fh);  // an earlier --flashhead export's
  if (options.flashhead) {
    report.flashhead_clusters = write_flashhead_cache(f, dir / kFlashHeadDir);
  } else if (std::filesystem::is_empty(dir / kFlashHeadDir, stale_fh) && !stale_fh) {
    std::filesystem::remove(dir / kFlashHeadDir, stale_fh);  // its directory too, unless it holds other files
  }

  write_text(dir / "config.json", config.dump(2) + "\n");
  write_text(dir / "generation_config.json", gemma3_generation_config(f).dump(2) + "\n");
  const size_t max_length = f.find_uint(arch + ".context_length").value_or(8192);
  // A base model (no chat template in the image) is exported without one, so that reading the
  // export back (transformers, vLLM, kestrel build) does not turn it into a chat model.
  text::export_hf_tokenizer(f, dir, max_length, text::MissingChatTemplate::kNone);
  std::error_code stale;
  std::filesystem::remove(dir / "chat_template.jinja", stale);
  if (const auto own = f.find_string("tokenizer.chat_template")) write_text(dir / "chat_template.jinja", *own);
  const auto licenses = write_licenses(f.find_string(keys::kLicenseText).value_or(""), dir);

  json prov = {
      {"exporter", std::string("kestrel ") + KESTREL_VERSION},
      {"export_date", utc_now()},
      {"image", {{"file", image_path.filename().string()},
                 {"sha256", sha256_file(image_path)},
                 {"content_xxh3", f.find_uint(keys::kContentHash).value_or(0)},
                 {"precision", f.find_string(keys::kPrecision).value_or("")},
                 {"quant_method", f.find_string(keys::kQuantMethod).value_or("")},
                 {"group_size", group},
                 {"zero_points", symmetric ? "none (symmetric)" : w4 ? f.find_string(keys::kZeroPointType).value_or("float") : "n/a"},
                 {"scale_bits", info->scale_bits},
                 {"tensor_types", f.find_string(keys::kTensorTypes).value_or("")},
                 {"flashhead", !row_of_token.empty()},
                 {"flashhead_exported", options.flashhead},
                 {"kestrel_version", f.find_string(keys::kKestrelVersion).value_or("")},
                 {"build_date", f.find_string(keys::kBuildDate).value_or("")},
                 {"source_file", f.find_string(keys::kSourceFile).value_or("")},
                 {"source_sha256", f.find_string(keys::kSourceSha256).value_or("")},
                 {"calibration_sha256", f.find_string(keys::kCalibrationSha256).value_or("")}}},
      {"format", w4 ? "compressed-tensors pack-quantized W4A16" : "dense"},
      {"dense_dtype", dtype},
      {"int4_matrices", report.int4_matrices},
      {"int4_groups", report.total_groups},
      {"requantized", {{"matrices", report.requantized_matrices}, {"groups", report.requantized_groups}}},
      {"exact", report.requantized_groups == 0},
      {"ignore", report.ignored},
      {"licence_files", licenses}};
  write_text(dir / "kestrel_export.json", prov.dump(2) + "\n");
  if (options.log && report.requantized_groups > 0) {
    options.log("requantized " + std::to_string(report.requantized_groups) + " of " + std::to_string(report.total_groups) +
                " INT4 groups in " + std::to_string(report.requantized_matrices) +
                " matrices (integer zero points, fitted to the image's weights): the export is close to the image, not "
                "identical");
  }
  return report;
}

}  // namespace kestrel::image
