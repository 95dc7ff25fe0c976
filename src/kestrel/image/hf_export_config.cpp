#include "kestrel/image/hf_export_config.h"

#include <cstdint>

#include "kestrel/base/error.h"

namespace kestrel::image {

using nlohmann::json;

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
            {"rms_norm_eps", static_cast<float>(f.get_float(key("attention.layer_norm_rms_epsilon")))},
            {"rope_theta", static_cast<float>(f.get_float(key("rope.freq_base")))},
            {"rope_local_base_freq", static_cast<float>(f.find_float(key("rope.freq_base_swa")).value_or(1e4))},
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
    c["final_logit_softcapping"] = static_cast<float>(*cap);
  }
  if (const auto type = f.find_string(key("rope.scaling.type")); type && *type == "linear") {
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", static_cast<float>(f.get_float(key("rope.scaling.factor")))}};
  }
  for (const auto& [hf, gg] : {std::pair{"bos_token_id", "tokenizer.ggml.bos_token_id"},
                               std::pair{"eos_token_id", "tokenizer.ggml.eos_token_id"},
                               std::pair{"pad_token_id", "tokenizer.ggml.padding_token_id"}}) {
    if (const auto id = f.find_uint(gg)) c[hf] = *id;
  }
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
      if (pieces[i] == "<end_of_turn>") {
        if (eos.empty() || eos[0] != i) eos.push_back(i);
        break;
      }
    }
  }
  if (!eos.empty()) g["eos_token_id"] = eos;
  return g;
}

}  // namespace kestrel::image
