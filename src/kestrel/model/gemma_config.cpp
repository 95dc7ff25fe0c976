#include "kestrel/model/gemma_config.h"

#include <cmath>

#include "kestrel/base/error.h"

namespace kestrel::model {
namespace {

/// Upper bound for any dimension read from metadata (16 Mi).
constexpr uint64_t kMaxDim = 1u << 24;

/// Metadata `name` as a dimension in 1..kMaxDim. Throws kestrel::Error when missing or out of range.
size_t positive(const gguf::File& file, const std::string& name) {
  const uint64_t v = file.get_uint(name);
  if (v == 0 || v > kMaxDim) throw Error("metadata " + name + " = " + std::to_string(v) + " is out of range");
  return static_cast<size_t>(v);
}

/// A hyperparameter written either as one number or as one number per layer.
std::vector<size_t> per_layer(const gguf::File& file, const std::string& name, size_t n_layers) {
  const gguf::Value* v = file.find(name);
  if (v == nullptr) throw Error("model file has no metadata " + name);
  if (v->type != gguf::ValueType::kArray) return std::vector<size_t>(n_layers, positive(file, name));
  const std::vector<int64_t> raw = file.get_int_array(name);
  if (raw.size() != n_layers) {
    throw Error("metadata " + name + " has " + std::to_string(raw.size()) + " entries for " +
                std::to_string(n_layers) + " layers");
  }
  std::vector<size_t> out;
  for (const int64_t x : raw) {
    if (x <= 0 || static_cast<uint64_t>(x) > kMaxDim) throw Error("metadata " + name + " has an entry out of range");
    out.push_back(static_cast<size_t>(x));
  }
  return out;
}

/// attention.layer_norm_rms_epsilon, which must lie in (0, 1).
float rms_epsilon(const gguf::File& file, const std::string& arch) {
  const auto eps = static_cast<float>(file.get_float(arch + ".attention.layer_norm_rms_epsilon"));
  if (!(eps > 0.0f && eps < 1.0f)) {
    throw Error(arch + ": attention.layer_norm_rms_epsilon must be in (0, 1), got " + std::to_string(eps));
  }
  return eps;
}

}  // namespace

GemmaConfig GemmaConfig::from_gguf(const gguf::File& file) {
  const std::string arch = file.get_string("general.architecture");
  if (arch == "gemma3") return gemma3_from_gguf(file);
  if (arch == "gemma4") return gemma4_from_gguf(file);
  throw Error("unsupported model architecture '" + arch + "' (supported: gemma3, gemma4)");
}

GemmaConfig GemmaConfig::gemma3_from_gguf(const gguf::File& file) {
  const auto key = [](const char* suffix) { return std::string("gemma3.") + suffix; };
  GemmaConfig c;
  c.architecture = "gemma3";
  const size_t n_layers = positive(file, key("block_count"));
  c.d_model = positive(file, key("embedding_length"));
  c.n_heads = positive(file, key("attention.head_count"));
  const size_t d_ff = positive(file, key("feed_forward_length"));
  const size_t n_kv_heads = positive(file, key("attention.head_count_kv"));
  const size_t head_dim = positive(file, key("attention.key_length"));
  if (positive(file, key("attention.value_length")) != head_dim) {
    throw Error("gemma3: key_length and value_length differ, which Gemma 3 never does");
  }
  c.context_length = positive(file, key("context_length"));
  const size_t window = positive(file, key("attention.sliding_window"));
  const uint64_t pattern = file.find_uint(key("attention.sliding_window_pattern")).value_or(6);
  if (pattern == 0) throw Error("gemma3: sliding_window_pattern must be > 0");
  c.rms_eps = rms_epsilon(file, c.architecture);
  const auto base_global = static_cast<float>(file.get_float(key("rope.freq_base")));
  const auto base_sliding = static_cast<float>(file.find_float(key("rope.freq_base_swa")).value_or(1e4));
  float position_scale_global = 1.0f;
  if (const auto type = file.find_string(key("rope.scaling.type")); type && *type == "linear") {
    const double factor = file.get_float(key("rope.scaling.factor"));
    if (!(factor > 0.0)) throw Error("gemma3: rope.scaling.factor must be positive");
    position_scale_global = static_cast<float>(1.0 / factor);
  }
  c.final_softcap = static_cast<float>(file.find_float(key("final_logit_softcapping")).value_or(0.0));
  c.embed_scale = std::sqrt(static_cast<float>(c.d_model));
  for (size_t il = 0; il < n_layers; ++il) {
    GemmaLayerConfig l;
    l.sliding = (il + 1) % pattern != 0;
    l.window = l.sliding ? window : 0;
    l.head_dim = head_dim;
    l.n_kv_heads = n_kv_heads;
    l.d_ff = d_ff;
    l.kv_source = il;
    l.rope.base = l.sliding ? base_sliding : base_global;
    l.rope.n_rot = head_dim;
    l.rope.position_scale = l.sliding ? 1.0f : position_scale_global;
    // llama.cpp (hparams.f_attention_scale for gemma3) and HF (query_pre_attn_scalar = head_dim
    // for every Gemma 3 size but 27B) agree on 1/sqrt(head_dim).
    l.query_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    c.layers.push_back(l);
  }
  c.validate();
  return c;
}

GemmaConfig GemmaConfig::gemma4_from_gguf(const gguf::File& file) {
  const auto key = [](const char* suffix) { return std::string("gemma4.") + suffix; };
  GemmaConfig c;
  c.architecture = "gemma4";
  const size_t n_layers = positive(file, key("block_count"));
  c.d_model = positive(file, key("embedding_length"));
  c.n_heads = positive(file, key("attention.head_count"));
  const std::vector<size_t> d_ff = per_layer(file, key("feed_forward_length"), n_layers);
  const std::vector<size_t> n_kv_heads = per_layer(file, key("attention.head_count_kv"), n_layers);
  const size_t head_dim_full = positive(file, key("attention.key_length"));
  const size_t head_dim_sliding = positive(file, key("attention.key_length_swa"));
  if (positive(file, key("attention.value_length")) != head_dim_full ||
      positive(file, key("attention.value_length_swa")) != head_dim_sliding) {
    throw Error("gemma4: key and value lengths differ, which Gemma 4 never does");
  }
  const uint64_t n_rot_full = file.find_uint(key("rope.dimension_count")).value_or(head_dim_full);
  const uint64_t n_rot_sliding = file.find_uint(key("rope.dimension_count_swa")).value_or(head_dim_sliding);
  c.context_length = positive(file, key("context_length"));
  const size_t window = positive(file, key("attention.sliding_window"));
  const gguf::Array& pattern = file.get_array(key("attention.sliding_window_pattern"));
  const auto* sliding = std::get_if<std::vector<uint8_t>>(&pattern.items);
  if (sliding == nullptr || sliding->size() != n_layers) {
    throw Error("gemma4: attention.sliding_window_pattern must be one bool per layer");
  }
  const uint64_t n_kv_shared = file.find_uint(key("attention.shared_kv_layers")).value_or(0);
  if (n_kv_shared >= n_layers) throw Error("gemma4: attention.shared_kv_layers must be below block_count");
  const uint64_t ple = file.find_uint(key("embedding_length_per_layer_input")).value_or(0);
  if (ple > kMaxDim) throw Error("gemma4: embedding_length_per_layer_input is out of range");
  c.ple_dim = static_cast<size_t>(ple);
  c.v_norm = true;
  c.v_optional = true;
  c.rms_eps = rms_epsilon(file, c.architecture);
  const double base_full = static_cast<float>(file.get_float(key("rope.freq_base")));
  const double base_sliding = static_cast<float>(file.find_float(key("rope.freq_base_swa")).value_or(1e4));
  c.final_softcap = static_cast<float>(file.find_float(key("final_logit_softcapping")).value_or(0.0));
  if (c.final_softcap < 0.0f) throw Error("gemma4: final_logit_softcapping must not be negative");
  c.embed_scale = std::sqrt(static_cast<float>(c.d_model));
  const size_t first_shared = n_layers - static_cast<size_t>(n_kv_shared);
  for (size_t il = 0; il < n_layers; ++il) {
    GemmaLayerConfig l;
    l.sliding = (*sliding)[il] != 0;
    l.window = l.sliding ? window : 0;
    l.head_dim = l.sliding ? head_dim_sliding : head_dim_full;
    l.n_kv_heads = n_kv_heads[il];
    l.d_ff = d_ff[il];
    l.kv_source = il;
    if (il >= first_shared) {
      // The last KV-owning layer of the same type (HF Gemma4TextAttention, kv_shared_layer_index).
      l.kv_source = n_layers;
      for (size_t j = first_shared; j-- > 0;) {
        if (((*sliding)[j] != 0) == l.sliding) {
          l.kv_source = j;
          break;
        }
      }
      if (l.kv_source == n_layers) {
        throw Error("gemma4: KV-shared layer " + std::to_string(il) + " has no earlier layer of its type");
      }
    }
    l.rope.base = l.sliding ? base_sliding : base_full;
    l.rope.n_rot = static_cast<size_t>(l.sliding ? n_rot_sliding : n_rot_full);
    l.rope.freq_factors = !l.sliding;
    l.query_scale = 1.0f;
    c.layers.push_back(l);
  }
  c.validate();
  return c;
}

void GemmaConfig::validate() const {
  const std::string what = architecture + ": ";
  if (layers.empty() || d_model == 0 || n_heads == 0 || context_length == 0) {
    throw Error(what + "layer count, d_model, head count and context length must be positive");
  }
  for (size_t il = 0; il < layers.size(); ++il) {
    const GemmaLayerConfig& l = layers[il];
    const std::string at = " at layer " + std::to_string(il);
    if (l.head_dim == 0 || l.n_kv_heads == 0 || l.d_ff == 0) throw Error(what + "a size is 0" + at);
    if (n_heads % l.n_kv_heads != 0) throw Error(what + "head_count is not a multiple of head_count_kv" + at);
    if (l.sliding != (l.window > 0)) throw Error(what + "sliding layers need a window, global ones none" + at);
    if (l.rope.n_rot == 0 || l.rope.n_rot % 2 != 0 || l.rope.n_rot > l.head_dim) {
      throw Error(what + "rope.dimension_count must be even, positive and at most the head size" + at);
    }
    if (!(l.rope.base > 1.0)) throw Error(what + "RoPE bases must exceed 1" + at);
    if (l.kv_source > il) throw Error(what + "a layer's KV source must not follow it" + at);
    const GemmaLayerConfig& src = layers[l.kv_source];
    if (l.kv_source != il && (src.kv_source != l.kv_source || src.sliding != l.sliding ||
                              src.head_dim != l.head_dim || src.n_kv_heads != l.n_kv_heads)) {
      throw Error(what + "a KV-shared layer must read an owning layer of its own type and shape" + at);
    }
  }
}

}  // namespace kestrel::model
