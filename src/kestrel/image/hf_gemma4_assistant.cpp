#include "kestrel/image/hf_gemma4_assistant.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <utility>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/gguf_writer.h"
#include "kestrel/formats/safetensors.h"
#include "kestrel/image/hf_common.h"

namespace kestrel::image {
namespace {

using gguf::TensorType;
using gguf::ValueType;
using nlohmann::json;
namespace st = safetensors;

bool get_bool(const json& c, const char* key, bool fallback) {
  return c.contains(key) && c[key].is_boolean() ? c[key].get<bool>() : fallback;
}

// HF name (Gemma4AssistantForCausalLM state dict) -> GGUF name below "mtp.", "" when not one of
// the assistant's tensors. K/V projections of the (all KV-shared) layers map to "-" (skipped:
// transformers ignores them on load too).
std::string assistant_name(const std::string& hf) {
  static const std::map<std::string, std::string> kGlobal = {
      {"model.embed_tokens.weight", "token_embd.weight"}, {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}, {"pre_projection.weight", "pre_proj.weight"},
      {"post_projection.weight", "post_proj.weight"}, {"masked_embedding.centroids.weight", "centroids.weight"},
      {"masked_embedding.token_ordering", "token_ordering.weight"}};
  static const std::map<std::string, std::string> kLayer = {
      {"self_attn.q_proj.weight", "attn_q"}, {"self_attn.o_proj.weight", "attn_output"},
      {"self_attn.q_norm.weight", "attn_q_norm"}, {"input_layernorm.weight", "attn_norm"},
      {"post_attention_layernorm.weight", "post_attention_norm"}, {"pre_feedforward_layernorm.weight", "ffn_norm"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm"}, {"mlp.gate_proj.weight", "ffn_gate"},
      {"mlp.up_proj.weight", "ffn_up"}, {"mlp.down_proj.weight", "ffn_down"}, {"layer_scalar", "layer_output_scale"},
      {"self_attn.k_proj.weight", "-"}, {"self_attn.v_proj.weight", "-"}, {"self_attn.k_norm.weight", "-"},
      {"self_attn.v_norm.weight", "-"}};
  if (const auto it = kGlobal.find(hf); it != kGlobal.end()) return it->second;
  static const std::regex re("model\\.layers\\.([0-9]{1,6})\\.(.+)");
  std::smatch m;
  if (!std::regex_match(hf, m, re)) return "";
  const auto it = kLayer.find(m[2].str());
  if (it == kLayer.end()) return "";
  if (it->second == "-") return "-";
  return "blk." + m[1].str() + "." + it->second + ".weight";
}

struct Planned {
  std::string hf, name;  // name without the "mtp." prefix
  int layer = -1;
  std::vector<uint64_t> shape;  // GGUF order
  TensorType type = TensorType::kF32;
  bool one_d = false;
  bool ids = false;  // an integer tensor written as float32 (token_ordering)
};

}  // namespace

std::string mtp_name(const std::string& name) { return "mtp." + name; }

bool is_hf_gemma4_assistant(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(dir / "config.json", ec)) return false;
  try {
    const json c = st::read_json(dir / "config.json");
    return c.is_object() && c.value("model_type", "") == "gemma4_assistant";
  } catch (const Error&) {
    return false;
  }
}

struct HfGemma4Assistant::Impl {
  Impl(st::Checkpoint c, std::string w) : ckpt(std::move(c)), where(std::move(w)) {}
  st::Checkpoint ckpt;
  std::string where;
  uint64_t n_layers = 0, d_model = 0, d_backbone = 0, d_ff = 0, n_heads = 0, window = 0, n_vocab = 0;
  uint64_t centroids = 0, top_k = 0, rotated_pairs = 0;
  double eps = 1e-6, theta_full = 1e6, theta_sliding = 1e4;
  std::vector<bool> sliding;
  std::vector<uint64_t> head_dim, n_kv;
  std::vector<Planned> plan;
};

HfGemma4Assistant::~HfGemma4Assistant() = default;
HfGemma4Assistant::HfGemma4Assistant(HfGemma4Assistant&&) noexcept = default;

HfGemma4Assistant::HfGemma4Assistant(const std::filesystem::path& dir, const AssistantTarget& target,
                                     const std::function<void(const std::string&)>& log)
    : impl_(new Impl(st::Checkpoint::open(dir), (dir / "config.json").string())) {
  Impl& a = *impl_;
  const std::string& where = a.where;
  const json& top = a.ckpt.config();
  if (!top.is_object() || top.value("model_type", "") != "gemma4_assistant") {
    throw Error(where + ": model_type is not 'gemma4_assistant' (a Gemma 4 MTP assistant checkpoint)");
  }
  if (!top.contains("text_config") || !top["text_config"].is_object()) throw Error(where + ": no text_config object");
  const json& c = top["text_config"];
  auto get_u = [&](const json& j, const char* key, std::optional<uint64_t> fallback, uint64_t min_value = 1) {
    return hf::get_uint(j, key, where, fallback, min_value);
  };
  a.d_backbone = get_u(top, "backbone_hidden_size", 1536);
  const bool ordered = get_bool(top, "use_ordered_embeddings", false);
  const bool tied = get_bool(top, "tie_word_embeddings", get_bool(c, "tie_word_embeddings", true));
  a.n_layers = get_u(c, "num_hidden_layers", std::nullopt);
  a.d_model = get_u(c, "hidden_size", std::nullopt);
  a.d_ff = get_u(c, "intermediate_size", std::nullopt);
  a.n_heads = get_u(c, "num_attention_heads", 8);
  a.n_vocab = get_u(c, "vocab_size", 262144);
  a.window = get_u(c, "sliding_window", 512);
  a.eps = hf::get_float(c, "rms_norm_eps", where, 1e-6);
  const uint64_t kv_default = get_u(c, "num_key_value_heads", 4);
  const uint64_t hd_sliding = get_u(c, "head_dim", 256);
  const uint64_t hd_full = get_u(c, "global_head_dim", 512);
  if (get_u(c, "hidden_size_per_layer_input", 256, 0) != 0) throw Error(where + ": hidden_size_per_layer_input must be 0 in an assistant");
  if (get_bool(c, "enable_moe_block", false)) throw Error(where + ": enable_moe_block must be false in an assistant");
  if (get_bool(c, "use_double_wide_mlp", false)) throw Error(where + ": use_double_wide_mlp must be false in an assistant");
  const uint64_t n_shared = get_u(c, "num_kv_shared_layers", 0, 0);
  if (n_shared != 0 && n_shared != a.n_layers) {
    throw Error(where + ": every layer of an assistant reads the target's K/V (num_kv_shared_layers " +
                std::to_string(n_shared) + ", num_hidden_layers " + std::to_string(a.n_layers) + ")");
  }
  if (c.contains("layer_types") && c["layer_types"].is_array()) {
    if (c["layer_types"].size() != a.n_layers) throw Error(where + ": layer_types has " + std::to_string(c["layer_types"].size()) + " entries for " + std::to_string(a.n_layers) + " layers");
    for (const auto& t : c["layer_types"]) {
      if (t == "sliding_attention") a.sliding.push_back(true);
      else if (t == "full_attention") a.sliding.push_back(false);
      else throw Error(where + ": layer_types holds an unknown type");
    }
  } else {
    for (uint64_t i = 0; i < a.n_layers; ++i) a.sliding.push_back((i + 1) % 6 != 0);
  }
  a.sliding.back() = false;  // as HF: the last layer is full attention
  // Per-layer head size and KV heads: transformers writes `per_layer_config` ({"3": {"head_dim": 64}}),
  // older configs `global_head_dim` / `num_global_key_value_heads` for the full layers.
  const json* per_layer = c.contains("per_layer_config") && c["per_layer_config"].is_object() ? &c["per_layer_config"] : nullptr;
  const uint64_t kv_full = get_u(c, "num_global_key_value_heads", kv_default);
  for (uint64_t il = 0; il < a.n_layers; ++il) {
    uint64_t hd = a.sliding[il] ? hd_sliding : hd_full, kv = a.sliding[il] ? kv_default : kv_full;
    if (per_layer != nullptr) {
      // per_layer_config replaces global_head_dim / num_global_key_value_heads (transformers
      // ignores them then): a layer it does not name has the base head_dim and KV heads.
      hd = hd_sliding;
      kv = kv_default;
      const std::string key = std::to_string(il);
      if (per_layer->contains(key) && (*per_layer)[key].is_object()) {
        hd = get_u((*per_layer)[key], "head_dim", hd);
        kv = get_u((*per_layer)[key], "num_key_value_heads", kv);
      }
    }
    a.head_dim.push_back(hd);
    a.n_kv.push_back(kv);
    const uint64_t want_hd = a.sliding[il] ? target.head_dim_sliding : target.head_dim_full;
    if (hd != want_hd || kv != target.n_kv_heads) {
      throw Error(where + ": layer " + std::to_string(il) + " (" + (a.sliding[il] ? "sliding" : "full") +
                  ") reads the target's K/V of " + std::to_string(target.n_kv_heads) + " heads of " +
                  std::to_string(want_hd) + " but is configured for " + std::to_string(kv) + " heads of " + std::to_string(hd));
    }
    if (a.n_heads % kv != 0) throw Error(where + ": num_attention_heads is not a multiple of the KV heads");
  }
  if (a.d_backbone != target.d_model) {
    throw Error(where + ": backbone_hidden_size " + std::to_string(a.d_backbone) + " is not the target's hidden size " + std::to_string(target.d_model));
  }
  if (a.n_vocab != target.n_vocab) {
    throw Error(where + ": vocab_size " + std::to_string(a.n_vocab) + " is not the target's " + std::to_string(target.n_vocab));
  }
  if (ordered) {
    a.centroids = get_u(top, "num_centroids", 2048);
    a.top_k = get_u(top, "centroid_intermediate_top_k", 32);
    if (a.n_vocab % a.centroids != 0) throw Error(where + ": num_centroids does not divide the vocabulary");
    if (a.top_k > a.centroids) throw Error(where + ": centroid_intermediate_top_k exceeds num_centroids");
  }
  // RoPE per layer type, as the target's converter reads it.
  uint64_t full_hd = 0;
  for (uint64_t il = 0; il < a.n_layers; ++il) {
    if (!a.sliding[il]) full_hd = a.head_dim[il];
  }
  double partial = 0.25;
  std::string full_type = "proportional";
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
    const json& rp = c["rope_parameters"];
    if (rp.contains("sliding_attention") && rp["sliding_attention"].is_object()) {
      a.theta_sliding = hf::get_float(rp["sliding_attention"], "rope_theta", where, 1e4);
    }
    if (rp.contains("full_attention") && rp["full_attention"].is_object()) {
      const json& f = rp["full_attention"];
      a.theta_full = hf::get_float(f, "rope_theta", where, 1e6);
      full_type = f.value("rope_type", "proportional");
      partial = hf::get_float(f, "partial_rotary_factor", where, full_type == "proportional" ? 0.25 : 1.0);
      if (hf::get_float(f, "factor", where, 1.0) != 1.0) throw Error(where + ": RoPE scaling factors are not supported");
    }
  }
  if (full_type != "proportional" && full_type != "default") throw Error(where + ": full-attention rope_type '" + full_type + "' is not supported");
  if (!(partial > 0.0 && partial <= 1.0)) throw Error(where + ": partial_rotary_factor must be in (0, 1]");
  a.rotated_pairs = full_type == "default" ? full_hd / 2 : static_cast<uint64_t>(partial * static_cast<double>(full_hd) / 2.0);

  size_t skipped = 0;
  for (const auto& hf : a.ckpt.names()) {
    Planned p;
    p.hf = hf;
    p.name = assistant_name(hf);
    if (p.name.empty()) throw Error(dir.string() + ": tensor '" + hf + "' is not part of a Gemma 4 assistant");
    if (p.name == "-") { ++skipped; continue; }
    if (p.name == "output.weight" && tied) {
      if (log) log("skipping " + hf + " (the assistant's output head is tied to its embedding)");
      continue;
    }
    if ((p.name == "centroids.weight" || p.name == "token_ordering.weight") && !ordered) {
      if (log) log("skipping " + hf + " (use_ordered_embeddings is false)");
      continue;
    }
    if (p.name.rfind("blk.", 0) == 0) p.layer = std::stoi(p.name.substr(4));
    if (p.layer >= static_cast<int>(a.n_layers)) throw Error(dir.string() + ": tensor '" + hf + "' is past num_hidden_layers");
    const auto il = static_cast<uint64_t>(std::max(p.layer, 0));
    const std::string& g = p.name;
    auto ends = [&](const char* s) { return g.size() >= std::strlen(s) && g.compare(g.size() - std::strlen(s), std::strlen(s), s) == 0; };
    const uint64_t hd = a.head_dim[il];
    std::vector<uint64_t> want;  // HF order
    if (g == "token_embd.weight" || g == "output.weight") want = {a.n_vocab, a.d_model};
    else if (g == "output_norm.weight") want = {a.d_model};
    else if (g == "pre_proj.weight") want = {a.d_model, 2 * a.d_backbone};
    else if (g == "post_proj.weight") want = {a.d_backbone, a.d_model};
    else if (g == "centroids.weight") want = {a.centroids, a.d_model};
    else if (g == "token_ordering.weight") want = {a.n_vocab};
    else if (ends(".attn_q_norm.weight")) want = {hd};
    else if (ends(".layer_output_scale.weight")) want = {1};
    else if (ends("norm.weight")) want = {a.d_model};
    else if (ends(".attn_q.weight")) want = {a.n_heads * hd, a.d_model};
    else if (ends(".attn_output.weight")) want = {a.d_model, a.n_heads * hd};
    else if (ends(".ffn_gate.weight") || ends(".ffn_up.weight")) want = {a.d_ff, a.d_model};
    else if (ends(".ffn_down.weight")) want = {a.d_model, a.d_ff};
    const auto& info = a.ckpt.info(hf);
    std::vector<uint64_t> have = info.shape;
    if (have.empty()) have = {1};
    if (have != want) {
      throw Error(dir.string() + ": tensor '" + hf + "' has shape " + hf::shape_str(info.shape) + ", config.json implies " + hf::shape_str(want));
    }
    p.one_d = want.size() == 1;
    if (g == "token_ordering.weight") {
      if (info.dtype != st::Dtype::kI64 && info.dtype != st::Dtype::kI32) {
        throw Error(dir.string() + ": tensor '" + hf + "' has dtype " + st::dtype_name(info.dtype) + "; token ids must be I64 or I32");
      }
      p.ids = true;
      p.type = TensorType::kF32;  // ids < 2^24 are exact in float32
    } else {
      p.type = hf::stored_type(dir, hf, info.dtype, p.one_d);
    }
    p.shape.assign(want.rbegin(), want.rend());
    a.plan.push_back(std::move(p));
  }
  if (skipped > 0 && log) log("skipping " + std::to_string(skipped) + " K/V tensors of the assistant (its layers read the target's K/V)");
  std::sort(a.plan.begin(), a.plan.end(), [](const Planned& x, const Planned& y) {
    return x.layer != y.layer ? x.layer < y.layer : x.name < y.name;
  });
  std::vector<std::string> required = {"token_embd.weight", "output_norm.weight", "pre_proj.weight", "post_proj.weight"};
  if (!tied) required.push_back("output.weight");
  if (ordered) required.insert(required.end(), {"centroids.weight", "token_ordering.weight"});
  for (uint64_t il = 0; il < a.n_layers; ++il) {
    for (const char* t : {"attn_q", "attn_output", "attn_q_norm", "attn_norm", "post_attention_norm", "ffn_norm",
                          "post_ffw_norm", "ffn_gate", "ffn_up", "ffn_down"}) {
      required.push_back("blk." + std::to_string(il) + "." + t + ".weight");
    }
  }
  for (const auto& r : required) {
    if (std::none_of(a.plan.begin(), a.plan.end(), [&](const Planned& p) { return p.name == r; })) {
      throw Error(dir.string() + ": the assistant checkpoint has no tensor for " + r);
    }
  }
  for (size_t i = 1; i < a.plan.size(); ++i) {
    if (a.plan[i].name == a.plan[i - 1].name) throw Error(dir.string() + ": tensors '" + a.plan[i - 1].hf + "' and '" + a.plan[i].hf + "' both map to " + a.plan[i].name);
  }
}

void HfGemma4Assistant::add_header(gguf::Writer& w) const {
  const Impl& a = *impl_;
  using hf::array;
  using hf::f32;
  using hf::u32;
  w.add(mtp_keys::kBlockCount, u32(a.n_layers));
  w.add(mtp_keys::kEmbeddingLength, u32(a.d_model));
  w.add(mtp_keys::kBackboneLength, u32(a.d_backbone));
  w.add(mtp_keys::kFeedForwardLength, u32(a.d_ff));
  w.add(mtp_keys::kHeadCount, u32(a.n_heads));
  w.add(mtp_keys::kHeadCountKv, array(ValueType::kUint32, std::vector<int64_t>(a.n_kv.begin(), a.n_kv.end())));
  w.add(mtp_keys::kKeyLength, array(ValueType::kUint32, std::vector<int64_t>(a.head_dim.begin(), a.head_dim.end())));
  w.add(mtp_keys::kSlidingWindow, u32(a.window));
  w.add(mtp_keys::kSlidingPattern, array(ValueType::kBool, std::vector<uint8_t>(a.sliding.begin(), a.sliding.end())));
  w.add(mtp_keys::kRmsEps, f32(a.eps));
  w.add(mtp_keys::kRopeBase, f32(a.theta_full));
  w.add(mtp_keys::kRopeBaseSwa, f32(a.theta_sliding));
  w.add(mtp_keys::kRopeRotatedPairs, u32(a.rotated_pairs));
  w.add(mtp_keys::kCentroids, u32(a.centroids));
  w.add(mtp_keys::kCentroidTopK, u32(a.top_k));
  for (const auto& p : a.plan) w.add_tensor(mtp_name(p.name), p.type, p.shape);
}

void HfGemma4Assistant::write_data(gguf::Writer& w) const {
  const Impl& a = *impl_;
  for (const auto& p : a.plan) {
    const auto& info = a.ckpt.info(p.hf);
    const auto data = a.ckpt.data(p.hf);
    if (p.ids) {
      std::vector<float> v(info.n_elements());
      for (size_t i = 0; i < v.size(); ++i) {
        int64_t id = 0;
        if (info.dtype == st::Dtype::kI64) {
          std::memcpy(&id, data.data() + i * 8, 8);
        } else {
          int32_t x = 0;
          std::memcpy(&x, data.data() + i * 4, 4);
          id = x;
        }
        if (id < 0 || static_cast<uint64_t>(id) >= a.n_vocab) {
          throw Error(a.ckpt.dir().string() + ": " + p.hf + " holds token id " + std::to_string(id) + ", outside the vocabulary");
        }
        v[i] = static_cast<float>(id);
      }
      w.write({reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(float)});
    } else {
      hf::write_tensor(w, data, info.dtype, std::max<uint64_t>(1, info.n_elements()),
                       !p.one_d && info.dtype != st::Dtype::kF64);
    }
    a.ckpt.release(p.hf);
  }
}

}  // namespace kestrel::image
