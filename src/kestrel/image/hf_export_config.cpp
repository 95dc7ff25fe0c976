#include "kestrel/image/hf_export_config.h"

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/model/gemma_config.h"

namespace kestrel::image {

using nlohmann::json;

namespace {

// A float32 value as the decimal it stands for: the shortest decimal that reads back as the
// same float32 (1e-06 for the float nearest 1e-6), not its exact expansion as a double
// (9.999999974752427e-07), which config.json readers would take literally.
double float_decimal(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf) - 1, static_cast<float>(v));
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

// config.json's bos / eos / pad token ids, from the GGUF's tokenizer keys where present.
void add_special_token_ids(const gguf::File& f, json& c) {
  for (const auto& [hf, gg] : {std::pair{"bos_token_id", "tokenizer.ggml.bos_token_id"},
                               std::pair{"eos_token_id", "tokenizer.ggml.eos_token_id"},
                               std::pair{"pad_token_id", "tokenizer.ggml.padding_token_id"}}) {
    if (const auto id = f.find_uint(gg)) c[hf] = *id;
  }
}

}  // namespace

json compressed_tensors_config(size_t group_size, bool symmetric, const std::vector<std::string>& ignore) {
  const json weights = {{"num_bits", 4},          {"type", "int"},       {"symmetric", symmetric},
                        {"strategy", "group"},    {"group_size", group_size}, {"dynamic", false},
                        {"actorder", nullptr},    {"block_structure", nullptr}, {"observer", "minmax"}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", weights},
              {"input_activations", nullptr},
              {"output_activations", nullptr},
              {"format", "pack-quantized"}}}}},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr}};
}

json gemma3_hf_config(const gguf::File& f, size_t vocab_size, bool tied, const std::string& dtype,
                      const json& quantization) {
  const std::string arch = f.get_string("general.architecture");
  auto key = [&](const char* k) { return arch + "." + k; };
  const uint64_t n_layers = f.get_uint(key("block_count"));
  const uint64_t head_dim = f.get_uint(key("attention.key_length"));
  const uint64_t pattern = f.find_uint(key("attention.sliding_window_pattern")).value_or(6);
  if (pattern == 0) throw Error("gemma3: sliding_window_pattern must be > 0");
  json layer_types = json::array();
  for (uint64_t i = 0; i < n_layers; ++i) layer_types.push_back((i + 1) % pattern == 0 ? "full_attention" : "sliding_attention");
  json c = {{"architectures", {"Gemma3ForCausalLM"}},
            {"model_type", "gemma3_text"},
            {"vocab_size", vocab_size},
            {"hidden_size", f.get_uint(key("embedding_length"))},
            {"intermediate_size", f.get_uint(key("feed_forward_length"))},
            {"num_hidden_layers", n_layers},
            {"num_attention_heads", f.get_uint(key("attention.head_count"))},
            {"num_key_value_heads", f.get_uint(key("attention.head_count_kv"))},
            {"head_dim", head_dim},
            {"query_pre_attn_scalar", head_dim},
            {"max_position_embeddings", f.get_uint(key("context_length"))},
            {"rms_norm_eps", float_decimal(f.get_float(key("attention.layer_norm_rms_epsilon")))},
            {"rope_theta", float_decimal(f.get_float(key("rope.freq_base")))},
            {"rope_local_base_freq", float_decimal(f.find_float(key("rope.freq_base_swa")).value_or(1e4))},
            {"sliding_window", f.get_uint(key("attention.sliding_window"))},
            {"sliding_window_pattern", pattern},
            {"layer_types", layer_types},
            {"hidden_activation", "gelu_pytorch_tanh"},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"attn_logit_softcapping", nullptr},
            {"final_logit_softcapping", nullptr},
            {"rope_scaling", nullptr},
            {"tie_word_embeddings", tied},
            {"use_cache", true},
            {"torch_dtype", dtype},
            {"dtype", dtype}};
  if (const auto cap = f.find_float(key("final_logit_softcapping")); cap && *cap > 0) {
    c["final_logit_softcapping"] = float_decimal(*cap);
  }
  if (const auto type = f.find_string(key("rope.scaling.type")); type && *type == "linear") {
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", float_decimal(f.get_float(key("rope.scaling.factor")))}};
  }
  add_special_token_ids(f, c);
  if (!quantization.is_null()) c["quantization_config"] = quantization;
  return c;
}

json gemma4_hf_config(const gguf::File& f, const std::vector<float>& rope_freqs, size_t vocab_size, size_t ple_vocab_size,
                      bool tied, const std::string& dtype, const json& quantization) {
  const auto m = model::GemmaConfig::gemma4_from_gguf(f);
  const size_t n = m.n_layers();
  size_t first_shared = n;
  while (first_shared > 0 && !m.owns_kv(first_shared - 1)) --first_shared;
  for (size_t il = 0; il < first_shared; ++il) {
    if (!m.owns_kv(il)) throw Error("gemma4 export: KV-shared layers must be the last ones (num_kv_shared_layers)");
  }
  // Head sizes, KV heads, MLP widths and RoPE per layer type, as Gemma4TextConfig holds them.
  size_t head_sliding = 0, head_full = 0;
  double theta_sliding = 1e4, theta_full = 1e6;
  const size_t d_ff = m.layers[0].d_ff;
  const size_t n_kv = m.layers[0].n_kv_heads;
  bool double_wide = false;
  json layer_types = json::array();
  for (size_t il = 0; il < n; ++il) {
    const auto& l = m.layers[il];
    const std::string at = " (layer " + std::to_string(il) + ")";
    (l.sliding ? head_sliding : head_full) = l.head_dim;
    (l.sliding ? theta_sliding : theta_full) = l.rope.base;
    layer_types.push_back(l.sliding ? "sliding_attention" : "full_attention");
    if (l.n_kv_heads != n_kv) throw Error("gemma4 export: KV head counts differ per layer, which Gemma4TextConfig cannot express" + at);
    if (l.rope.n_rot != l.head_dim) {
      throw Error("gemma4 export: rope.dimension_count below the head size is not expressible in Gemma4TextConfig" + at);
    }
    if (l.d_ff == 2 * d_ff && il >= first_shared) {
      double_wide = true;
    } else if (l.d_ff != d_ff) {
      throw Error("gemma4 export: MLP widths differ per layer other than double-wide KV-shared layers" + at);
    }
  }
  if (double_wide) {
    for (size_t il = first_shared; il < n; ++il) {
      if (m.layers[il].d_ff != 2 * d_ff) throw Error("gemma4 export: only some KV-shared layers have a double-wide MLP");
    }
  }
  if (m.layers.back().sliding) throw Error("gemma4 export: the last layer is a sliding one (transformers forces it to full attention)");
  if (head_sliding == 0) head_sliding = head_full;
  // rope_freqs: llama.cpp's factors the full layers divide their frequencies by: 1 on the
  // rotated pairs, then >= 1e30 (no rotation) — HF's proportional RoPE with
  // partial_rotary_factor = rotated pairs / (head size / 2).
  size_t rotated = head_full / 2;
  if (!rope_freqs.empty()) {
    if (rope_freqs.size() != head_full / 2) throw Error("gemma4 export: rope_freqs does not have head size / 2 entries");
    rotated = 0;
    while (rotated < rope_freqs.size() && rope_freqs[rotated] == 1.0f) ++rotated;
    for (size_t i = rotated; i < rope_freqs.size(); ++i) {
      if (!(rope_freqs[i] >= 1e30f)) {
        throw Error("gemma4 export: rope_freqs holds factors other than 1 then >= 1e30, which Gemma4TextConfig cannot express");
      }
    }
  }
  const double partial = static_cast<double>(2 * rotated) / static_cast<double>(head_full);
  const std::string arch = "gemma4";
  auto key = [&](const char* k) { return arch + "." + k; };
  json c = {{"architectures", {"Gemma4ForCausalLM"}},
            {"model_type", "gemma4_text"},
            {"vocab_size", vocab_size},
            {"hidden_size", m.d_model},
            {"intermediate_size", d_ff},
            {"num_hidden_layers", n},
            {"num_attention_heads", m.n_heads},
            {"num_key_value_heads", n_kv},
            {"head_dim", head_sliding},
            {"global_head_dim", head_full},
            {"layer_types", layer_types},
            {"sliding_window", f.get_uint(key("attention.sliding_window"))},
            {"num_kv_shared_layers", n - first_shared},
            {"use_double_wide_mlp", double_wide},
            {"hidden_size_per_layer_input", m.ple_dim},
            {"vocab_size_per_layer_input", m.ple_dim > 0 ? ple_vocab_size : vocab_size},
            {"max_position_embeddings", m.context_length},
            {"rms_norm_eps", float_decimal(m.rms_eps)},
            {"rope_parameters",
             {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", float_decimal(theta_sliding)}}},
              {"full_attention",
               {{"rope_type", "proportional"}, {"partial_rotary_factor", partial}, {"rope_theta", float_decimal(theta_full)}}}}},
            {"final_logit_softcapping", nullptr},
            {"hidden_activation", "gelu_pytorch_tanh"},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"attention_k_eq_v", false},
            {"enable_moe_block", false},
            {"tie_word_embeddings", tied},
            {"use_cache", true},
            {"torch_dtype", dtype},
            {"dtype", dtype}};
  if (m.final_softcap > 0.0f) c["final_logit_softcapping"] = float_decimal(m.final_softcap);
  add_special_token_ids(f, c);
  if (!quantization.is_null()) c["quantization_config"] = quantization;
  return c;
}

json gemma3_generation_config(const gguf::File& f) {
  json g = {{"_from_model_config", false}};
  if (const auto id = f.find_uint("tokenizer.ggml.bos_token_id")) g["bos_token_id"] = *id;
  if (const auto id = f.find_uint("tokenizer.ggml.padding_token_id")) g["pad_token_id"] = *id;
  json eos = json::array();
  if (const auto id = f.find_uint("tokenizer.ggml.eos_token_id")) eos.push_back(*id);
  if (const auto* tokens = f.find("tokenizer.ggml.tokens")) {
    (void)tokens;
    const auto& pieces = f.get_string_array("tokenizer.ggml.tokens");
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i] == "<end_of_turn>" || pieces[i] == "<turn|>") {
        if (eos.empty() || eos[0] != i) eos.push_back(i);
        break;
      }
    }
  }
  if (!eos.empty()) g["eos_token_id"] = eos;
  return g;
}

}  // namespace kestrel::image
