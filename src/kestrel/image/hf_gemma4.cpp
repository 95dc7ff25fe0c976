#include "kestrel/image/hf_gemma4.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <tuple>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/formats/gguf_writer.h"
#include "kestrel/formats/safetensors.h"
#include "kestrel/image/hf_common.h"
#include "kestrel/image/hf_compressed_tensors.h"
#include "kestrel/image/hf_gemma4_assistant.h"

namespace kestrel::image {
namespace {

using gguf::TensorType;
using gguf::Value;
using gguf::ValueType;
using nlohmann::json;
namespace st = safetensors;

constexpr int64_t kNormal = 1, kControl = 3, kUserDefined = 4, kByte = 6;
// Tokens llama.cpp's converter marks USER_DEFINED so that they are always rendered.
const std::set<std::string> kVisible = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
                                        "<|tool_response>", "<tool_response|>", "<|\"|>"};

using hf::array;
using hf::boolean;
using hf::f32;
using hf::str;
using hf::u32;

struct Context {
  std::filesystem::path dir;
  std::string where() const { return (dir / "config.json").string(); }
};

const json& text_config(const json& c, const Context& ctx) {
  const std::string type = c.value("model_type", "");
  if (type == "gemma4_text") return c;
  if (type == "gemma4" && c.contains("text_config") && c["text_config"].is_object()) return c["text_config"];
  throw Error(ctx.where() + ": model_type '" + type + "' is not a Gemma 4 model");
}

uint64_t get_uint(const json& c, const char* key, const Context& ctx, std::optional<uint64_t> fallback = std::nullopt) {
  return hf::get_uint(c, key, ctx.where(), fallback, 0);
}

double get_float(const json& c, const char* key, const Context& ctx, double fallback) {
  return hf::get_float(c, key, ctx.where(), fallback);
}

bool get_bool(const json& c, const char* key, bool fallback) {
  return c.contains(key) && c[key].is_boolean() ? c[key].get<bool>() : fallback;
}

struct Hparams {
  uint64_t n_layers, d_model, d_ff, n_heads, n_kv, head_dim, global_head_dim, ple_dim, n_shared, window;
  bool double_wide;
  std::vector<bool> sliding;
  double theta_full, theta_sliding, partial_rotary, eps, softcap;
  std::string rope_type_full;
  uint64_t ff(uint64_t il) const { return double_wide && il >= n_layers - n_shared ? 2 * d_ff : d_ff; }
  uint64_t hd(uint64_t il) const { return sliding[il] ? head_dim : global_head_dim; }
};

Hparams read_hparams(const json& c, const Context& ctx) {
  Hparams h{};
  h.n_layers = get_uint(c, "num_hidden_layers", ctx);
  h.d_model = get_uint(c, "hidden_size", ctx);
  h.d_ff = get_uint(c, "intermediate_size", ctx);
  h.n_heads = get_uint(c, "num_attention_heads", ctx, 8);
  h.n_kv = get_uint(c, "num_key_value_heads", ctx, 4);
  h.head_dim = get_uint(c, "head_dim", ctx, 256);
  h.global_head_dim = get_uint(c, "global_head_dim", ctx, 512);
  h.ple_dim = get_uint(c, "hidden_size_per_layer_input", ctx, 256);
  h.n_shared = get_uint(c, "num_kv_shared_layers", ctx, 0);
  h.window = get_uint(c, "sliding_window", ctx, 512);
  h.double_wide = get_bool(c, "use_double_wide_mlp", false);
  h.eps = get_float(c, "rms_norm_eps", ctx, 1e-6);
  h.softcap = get_float(c, "final_logit_softcapping", ctx, 0.0);
  if (h.n_layers == 0 || h.d_model == 0 || h.d_ff == 0 || h.n_heads == 0 || h.n_kv == 0 || h.head_dim == 0 ||
      h.global_head_dim == 0 || h.window == 0) {
    throw Error(ctx.where() + ": a layer size is 0");
  }
  if (get_bool(c, "enable_moe_block", false)) throw Error(ctx.where() + ": enable_moe_block is set; Kestrel runs the dense Gemma 4 models (E2B, E4B) only");
  if (get_bool(c, "attention_k_eq_v", false)) throw Error(ctx.where() + ": attention_k_eq_v is set; Kestrel runs Gemma 4 E2B / E4B, which do not use it");
  if (h.n_shared >= h.n_layers) throw Error(ctx.where() + ": num_kv_shared_layers must be below num_hidden_layers");
  if (h.n_heads % h.n_kv != 0) throw Error(ctx.where() + ": num_attention_heads is not a multiple of num_key_value_heads");
  if (c.contains("layer_types") && c["layer_types"].is_array()) {
    const json& types = c["layer_types"];
    if (types.size() != h.n_layers) throw Error(ctx.where() + ": layer_types has " + std::to_string(types.size()) + " entries for " + std::to_string(h.n_layers) + " layers");
    for (const auto& t : types) {
      if (t == "sliding_attention") h.sliding.push_back(true);
      else if (t == "full_attention") h.sliding.push_back(false);
      else throw Error(ctx.where() + ": layer_types holds an unknown type");
    }
  } else {
    for (uint64_t i = 0; i < h.n_layers; ++i) h.sliding.push_back((i + 1) % 6 != 0);  // HF's default
  }
  h.sliding.back() = false;  // HF forces the last layer to full attention
  h.theta_sliding = 1e4;
  h.theta_full = 1e6;
  h.partial_rotary = 0.25;
  h.rope_type_full = "proportional";
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
    const json& rp = c["rope_parameters"];
    if (rp.contains("sliding_attention") && rp["sliding_attention"].is_object()) {
      h.theta_sliding = get_float(rp["sliding_attention"], "rope_theta", ctx, 1e4);
    }
    if (rp.contains("full_attention") && rp["full_attention"].is_object()) {
      const json& f = rp["full_attention"];
      h.theta_full = get_float(f, "rope_theta", ctx, 1e6);
      h.rope_type_full = f.value("rope_type", "proportional");
      h.partial_rotary = get_float(f, "partial_rotary_factor", ctx, h.rope_type_full == "proportional" ? 0.25 : 1.0);
      if (f.contains("factor") && get_float(f, "factor", ctx, 1.0) != 1.0) {
        throw Error(ctx.where() + ": RoPE scaling factors are not supported for Gemma 4");
      }
    }
  }
  if (h.rope_type_full != "proportional" && h.rope_type_full != "default") {
    throw Error(ctx.where() + ": full-attention rope_type '" + h.rope_type_full + "' is not supported (proportional or default)");
  }
  if (!(h.partial_rotary > 0.0 && h.partial_rotary <= 1.0)) throw Error(ctx.where() + ": partial_rotary_factor must be in (0, 1]");
  // Every KV-shared layer needs an earlier layer of its type to read from.
  for (uint64_t il = h.n_layers - h.n_shared; il < h.n_layers; ++il) {
    bool found = false;
    for (uint64_t j = 0; j < h.n_layers - h.n_shared; ++j) found = found || h.sliding[j] == h.sliding[il];
    if (!found) throw Error(ctx.where() + ": KV-shared layer " + std::to_string(il) + " has no earlier layer of its type");
  }
  return h;
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<double> scores;
  std::vector<int64_t> types;
  std::vector<std::string> merges;
  std::map<std::string, int64_t> ids;
};

Vocab read_vocab(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer.json";
  if (!std::filesystem::is_regular_file(path)) throw Error(dir.string() + " has no tokenizer.json (kestrel build reads the vocabulary from it)");
  const json tj = st::read_json(path);
  if (!tj.contains("model") || !tj["model"].is_object() || tj["model"].value("type", "") != "BPE" ||
      !tj["model"].contains("vocab") || !tj["model"]["vocab"].is_object() || !tj["model"].contains("merges") ||
      !tj["model"]["merges"].is_array()) {
    throw Error(path.string() + " is not a BPE tokenizer with vocab and merges, as Gemma 4's is");
  }
  if (tj.contains("pre_tokenizer") && tj["pre_tokenizer"].dump().find("ByteLevel") != std::string::npos) {
    throw Error(path.string() + ": a byte-level (GPT-2 style) pre-tokenizer is not Gemma 4's tokenizer");
  }
  std::map<int64_t, std::pair<std::string, int64_t>> by_id;
  auto put = [&](const std::string& piece, const json& id, int64_t type) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > (1u << 24)) throw Error(path.string() + ": token '" + piece + "' has a bad id");
    by_id[id.get<int64_t>()] = {piece, type};
  };
  static const std::regex byte_re("<0x[0-9A-F]{2}>");
  for (const auto& [piece, id] : tj["model"]["vocab"].items()) {
    put(piece, id, piece.size() == 6 && std::regex_match(piece, byte_re) ? kByte : kNormal);
  }
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const auto& t : tj["added_tokens"]) {
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string() || !t.contains("id")) {
        throw Error(path.string() + ": an added_tokens entry has no content or id");
      }
      put(t["content"].get<std::string>(), t["id"], t.value("special", false) ? kControl : kUserDefined);
    }
  }
  if (by_id.empty()) throw Error(path.string() + " has an empty vocabulary");
  const auto n = static_cast<size_t>(by_id.rbegin()->first + 1);
  if (by_id.size() != n) throw Error(path.string() + ": token ids are not contiguous");
  Vocab v;
  for (const auto& [id, entry] : by_id) {
    v.tokens.push_back(entry.first);
    v.types.push_back(kVisible.count(entry.first) ? kUserDefined : entry.second);
    v.scores.push_back(entry.second == kNormal ? -static_cast<double>(id) : 0.0);
    v.ids[entry.first] = id;
  }
  for (const auto& m : tj["model"]["merges"]) {
    if (m.is_string()) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      throw Error(path.string() + ": a merge is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  return v;
}

std::optional<uint64_t> first_id(const json& c, const char* key) {
  if (!c.contains(key)) return std::nullopt;
  const json& t = c[key].is_array() && !c[key].empty() ? c[key][0] : c[key];
  if (!t.is_number_unsigned()) return std::nullopt;
  return t.get<uint64_t>();
}

// HF name below the text model's prefix -> GGUF name, or "" when not a Gemma 4 text tensor.
std::string gguf_name(const std::string& hf) {
  static const std::map<std::string, std::string> kGlobal = {
      {"embed_tokens.weight", "token_embd.weight"}, {"norm.weight", "output_norm.weight"},
      {"embed_tokens_per_layer.weight", "per_layer_token_embd.weight"},
      {"per_layer_model_projection.weight", "per_layer_model_proj.weight"},
      {"per_layer_projection_norm.weight", "per_layer_proj_norm.weight"}};
  static const std::map<std::string, std::string> kLayer = {
      {"self_attn.q_proj.weight", "attn_q"}, {"self_attn.k_proj.weight", "attn_k"},
      {"self_attn.v_proj.weight", "attn_v"}, {"self_attn.o_proj.weight", "attn_output"},
      {"self_attn.q_norm.weight", "attn_q_norm"}, {"self_attn.k_norm.weight", "attn_k_norm"},
      {"input_layernorm.weight", "attn_norm"}, {"post_attention_layernorm.weight", "post_attention_norm"},
      {"pre_feedforward_layernorm.weight", "ffn_norm"}, {"post_feedforward_layernorm.weight", "post_ffw_norm"},
      {"mlp.gate_proj.weight", "ffn_gate"}, {"mlp.up_proj.weight", "ffn_up"}, {"mlp.down_proj.weight", "ffn_down"},
      {"per_layer_input_gate.weight", "inp_gate"}, {"per_layer_projection.weight", "proj"},
      {"post_per_layer_input_norm.weight", "post_norm"}, {"layer_scalar", "layer_output_scale"}};
  if (const auto it = kGlobal.find(hf); it != kGlobal.end()) return it->second;
  static const std::regex re("layers\\.([0-9]{1,6})\\.(.+)");
  std::smatch m;
  if (!std::regex_match(hf, m, re)) return "";
  const auto it = kLayer.find(m[2].str());
  if (it == kLayer.end()) return "";
  return "blk." + m[1].str() + "." + it->second + ".weight";
}

bool is_tower(const std::string& name) {
  for (const char* p : {"model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.",
                        "vision_tower.", "audio_tower.", "embed_vision.", "embed_audio."}) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

std::string strip_prefix(const std::string& name) {
  for (const char* p : {"model.language_model.", "language_model.model.", "language_model.", "model."}) {
    if (name.rfind(p, 0) == 0) return name.substr(std::strlen(p));
  }
  return name;
}

struct Planned {
  std::string hf, name;
  int layer = -1;
  std::vector<uint64_t> shape;  // GGUF order
  TensorType type = TensorType::kF32;
  bool one_d = false;
  bool int4 = false;  // a compressed-tensors Linear (hf is its module name + ".weight")
};

}  // namespace

bool is_hf_gemma4(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(dir / "config.json", ec)) return false;
  try {
    const json c = st::read_json(dir / "config.json");
    const std::string type = c.is_object() ? c.value("model_type", "") : "";
    return type == "gemma4" || type == "gemma4_text";
  } catch (const Error&) {
    return false;
  }
}

void write_hf_gemma4_gguf(const std::filesystem::path& dir, const std::filesystem::path& out,
                          const std::function<void(const std::string&)>& log,
                          const std::filesystem::path& assistant) {
  const Context ctx{dir};
  const st::Checkpoint ckpt = st::Checkpoint::open(dir);
  const json& c = text_config(ckpt.config(), ctx);
  const Hparams h = read_hparams(c, ctx);
  const Vocab vocab = read_vocab(dir);
  const uint64_t n_vocab = vocab.tokens.size();
  const uint64_t first_shared = h.n_layers - h.n_shared;
  // A compressed-tensors W4A16 checkpoint (what `kestrel export` writes): its quantized Linears
  // become image INT4 tensors, copied by build_image (image/hf_compressed_tensors.h).
  const std::optional<CtScheme> ct = compressed_tensors_scheme(ckpt.config(), ctx.where());

  std::vector<Planned> plan;
  size_t towers = 0, shared_kv = 0;
  for (const auto& hf : ckpt.names()) {
    if (is_tower(hf)) { ++towers; continue; }
    const std::string bare = strip_prefix(hf);
    if (bare == "lm_head.weight") {
      if (log) log("skipping " + hf + " (the output head is tied to the embedding)");
      continue;
    }
    Planned p;
    p.hf = hf;
    const CtRole role = ct_role(bare, dir.string() + ": tensor '" + hf + "'");
    if (ct && role == CtRole::kAuxiliary) continue;  // read with their weight_packed
    std::string bare_weight = bare;
    if (ct && role == CtRole::kPacked) {
      p.int4 = true;
      p.hf = hf.substr(0, hf.size() - std::strlen("_packed"));
      bare_weight = bare.substr(0, bare.size() - std::strlen("_packed"));
    }
    p.name = gguf_name(bare_weight);
    if (p.name.empty()) throw Error(dir.string() + ": tensor '" + hf + "' is not part of a Gemma 4 text model");
    if (p.int4 && (p.name.rfind("blk.", 0) != 0 || p.name.find("norm") != std::string::npos ||
                   p.name.find("layer_output_scale") != std::string::npos)) {
      throw Error(dir.string() + ": tensor '" + hf + "' is quantized but is not a layer matrix");
    }
    if (p.name.rfind("blk.", 0) == 0) p.layer = std::stoi(p.name.substr(4));
    if (p.layer >= static_cast<int>(h.n_layers)) throw Error(dir.string() + ": tensor '" + hf + "' is past num_hidden_layers");
    const auto il = static_cast<uint64_t>(std::max(p.layer, 0));
    const std::string& g = p.name;
    auto ends = [&](const char* s) { return g.size() >= std::strlen(s) && g.compare(g.size() - std::strlen(s), std::strlen(s), s) == 0; };
    if (p.layer >= 0 && il >= first_shared && (ends(".attn_k.weight") || ends(".attn_v.weight") || ends(".attn_k_norm.weight"))) {
      ++shared_kv;  // KV-shared layers read an earlier layer's cache; nothing uses these
      continue;
    }
    const uint64_t hd = p.layer >= 0 ? h.hd(il) : 0;
    std::vector<uint64_t> want;  // HF order
    if (g == "token_embd.weight") want = {n_vocab, h.d_model};
    else if (g == "per_layer_token_embd.weight") want = {n_vocab, h.n_layers * h.ple_dim};
    else if (g == "per_layer_model_proj.weight") want = {h.n_layers * h.ple_dim, h.d_model};
    else if (g == "per_layer_proj_norm.weight") want = {h.ple_dim};
    else if (g == "output_norm.weight") want = {h.d_model};
    else if (ends(".attn_q_norm.weight") || ends(".attn_k_norm.weight")) want = {hd};
    else if (ends(".layer_output_scale.weight")) want = {1};
    else if (ends("norm.weight")) want = {h.d_model};
    else if (ends(".attn_q.weight")) want = {h.n_heads * hd, h.d_model};
    else if (ends(".attn_k.weight") || ends(".attn_v.weight")) want = {h.n_kv * hd, h.d_model};
    else if (ends(".attn_output.weight")) want = {h.d_model, h.n_heads * hd};
    else if (ends(".ffn_gate.weight") || ends(".ffn_up.weight")) want = {h.ff(il), h.d_model};
    else if (ends(".ffn_down.weight")) want = {h.d_model, h.ff(il)};
    else if (ends(".inp_gate.weight")) want = {h.ple_dim, h.d_model};
    else if (ends(".proj.weight")) want = {h.d_model, h.ple_dim};
    if (p.int4) {
      const auto& si = ckpt.info(p.hf + "_shape");
      if (si.dtype != st::Dtype::kI64 || si.n_elements() != 2) throw Error(dir.string() + ": " + p.hf + "_shape is not two int64 values");
      int64_t rc[2];
      std::memcpy(rc, ckpt.data(p.hf + "_shape").data(), sizeof(rc));
      const std::vector<uint64_t> have = {rc[0] > 0 ? static_cast<uint64_t>(rc[0]) : 0, rc[1] > 0 ? static_cast<uint64_t>(rc[1]) : 0};
      if (have != want) {
        throw Error(dir.string() + ": " + p.hf + "_shape is " + hf::shape_str(have) + ", config.json implies " + hf::shape_str(want));
      }
      p.shape.assign(want.rbegin(), want.rend());
      plan.push_back(std::move(p));
      continue;
    }
    const auto& info = ckpt.info(hf);
    std::vector<uint64_t> have = info.shape;
    if (have.empty()) have = {1};  // a 0-D layer_scalar
    if (have != want) {
      throw Error(dir.string() + ": tensor '" + hf + "' has shape " + hf::shape_str(info.shape) + ", config.json and tokenizer.json imply " + hf::shape_str(want));
    }
    p.one_d = want.size() == 1;
    p.type = hf::stored_type(dir, hf, info.dtype, p.one_d);
    p.shape.assign(want.rbegin(), want.rend());
    plan.push_back(std::move(p));
  }
  if (towers > 0 && log) log("skipping " + std::to_string(towers) + " vision / audio tower tensors (text model only)");
  if (shared_kv > 0 && log) log("skipping " + std::to_string(shared_kv) + " K/V tensors of KV-shared layers (never read)");
  std::sort(plan.begin(), plan.end(), [](const Planned& a, const Planned& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.name < b.name;
  });
  for (size_t i = 1; i < plan.size(); ++i) {
    if (plan[i].name == plan[i - 1].name) throw Error(dir.string() + ": tensors '" + plan[i - 1].hf + "' and '" + plan[i].hf + "' both map to " + plan[i].name);
  }
  {
    std::vector<std::string> required = {"token_embd.weight", "output_norm.weight"};
    if (h.ple_dim > 0) {
      for (const char* t : {"per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight"}) required.push_back(t);
    }
    for (uint64_t il = 0; il < h.n_layers; ++il) {
      std::vector<const char*> names = {"attn_q", "attn_output", "attn_q_norm", "attn_norm", "post_attention_norm",
                                        "ffn_norm", "post_ffw_norm", "ffn_gate", "ffn_up", "ffn_down"};
      if (il < first_shared) names.insert(names.end(), {"attn_k", "attn_v", "attn_k_norm"});
      if (h.ple_dim > 0) names.insert(names.end(), {"inp_gate", "proj", "post_norm"});
      for (const char* t : names) required.push_back("blk." + std::to_string(il) + "." + t + ".weight");
    }
    for (const auto& r : required) {
      if (std::none_of(plan.begin(), plan.end(), [&](const Planned& p) { return p.name == r; })) {
        throw Error(dir.string() + ": the checkpoint has no tensor for " + r);
      }
    }
  }

  std::optional<HfGemma4Assistant> mtp;
  if (!assistant.empty()) {
    if (!is_hf_gemma4_assistant(assistant)) {
      throw Error(assistant.string() + " is not a Gemma 4 assistant checkpoint (config.json model_type gemma4_assistant)");
    }
    mtp.emplace(assistant, AssistantTarget{h.d_model, n_vocab, h.n_kv, h.head_dim, h.global_head_dim}, log);
  }

  gguf::Writer w(out, 32);
  w.add("general.architecture", str("gemma4"));
  w.add("general.type", str("model"));
  w.add("general.name", str(dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string()));
  w.add("gemma4.context_length", u32(get_uint(c, "max_position_embeddings", ctx, 131072)));
  w.add("gemma4.embedding_length", u32(h.d_model));
  w.add("gemma4.block_count", u32(h.n_layers));
  if (h.double_wide) {
    std::vector<int64_t> ff;
    for (uint64_t il = 0; il < h.n_layers; ++il) ff.push_back(static_cast<int64_t>(h.ff(il)));
    w.add("gemma4.feed_forward_length", array(ValueType::kUint32, ff));
  } else {
    w.add("gemma4.feed_forward_length", u32(h.d_ff));
  }
  w.add("gemma4.attention.head_count", u32(h.n_heads));
  w.add("gemma4.attention.head_count_kv", u32(h.n_kv));
  w.add("gemma4.attention.layer_norm_rms_epsilon", f32(h.eps));
  w.add("gemma4.attention.key_length", u32(h.global_head_dim));
  w.add("gemma4.attention.value_length", u32(h.global_head_dim));
  w.add("gemma4.attention.key_length_swa", u32(h.head_dim));
  w.add("gemma4.attention.value_length_swa", u32(h.head_dim));
  w.add("gemma4.rope.freq_base", f32(h.theta_full));
  w.add("gemma4.rope.freq_base_swa", f32(h.theta_sliding));
  w.add("gemma4.rope.dimension_count", u32(h.global_head_dim));
  w.add("gemma4.rope.dimension_count_swa", u32(h.head_dim));
  w.add("gemma4.attention.sliding_window", u32(h.window));
  w.add("gemma4.attention.sliding_window_pattern", array(ValueType::kBool, std::vector<uint8_t>(h.sliding.begin(), h.sliding.end())));
  w.add("gemma4.attention.shared_kv_layers", u32(h.n_shared));
  w.add("gemma4.embedding_length_per_layer_input", u32(h.ple_dim));
  if (h.softcap > 0.0) w.add("gemma4.final_logit_softcapping", f32(h.softcap));

  const json tc = hf::read_tokenizer_config(dir);
  w.add("tokenizer.ggml.model", str("gemma4"));
  w.add("tokenizer.ggml.tokens", array(ValueType::kString, vocab.tokens));
  w.add("tokenizer.ggml.scores", array(ValueType::kFloat32, vocab.scores));
  w.add("tokenizer.ggml.token_type", array(ValueType::kInt32, vocab.types));
  w.add("tokenizer.ggml.merges", array(ValueType::kString, vocab.merges));
  const json& cfg = ckpt.config();
  const std::tuple<const char*, const char*, const char*, uint64_t> specials[] = {
      {"<bos>", "bos_token_id", "tokenizer.ggml.bos_token_id", 2}, {"<eos>", "eos_token_id", "tokenizer.ggml.eos_token_id", 1},
      {"<unk>", nullptr, "tokenizer.ggml.unknown_token_id", 3}, {"<pad>", "pad_token_id", "tokenizer.ggml.padding_token_id", 0}};
  for (const auto& [piece, cfg_key, key, fallback] : specials) {
    std::optional<uint64_t> id;
    if (const auto it = vocab.ids.find(piece); it != vocab.ids.end()) id = static_cast<uint64_t>(it->second);
    if (!id && cfg_key) id = first_id(c, cfg_key) ? first_id(c, cfg_key) : first_id(cfg, cfg_key);
    if (!id) id = fallback;
    if (*id < n_vocab) w.add(key, u32(*id));
  }
  w.add("tokenizer.ggml.add_space_prefix", boolean(false));
  w.add("tokenizer.ggml.add_bos_token", boolean(tc.value("add_bos_token", true)));
  std::string chat_template;  // tokenizer_config.json's, else chat_template.jinja (as for Gemma 3)
  if (tc.contains("chat_template") && tc["chat_template"].is_string()) chat_template = tc["chat_template"].get<std::string>();
  if (chat_template.empty() && std::filesystem::is_regular_file(dir / "chat_template.jinja")) {
    std::ifstream in(dir / "chat_template.jinja", std::ios::binary);
    chat_template.assign(std::istreambuf_iterator<char>(in), {});
  }
  if (!chat_template.empty()) w.add("tokenizer.chat_template", str(chat_template));
  w.add("general.quantization_version", u32(2));

  // rope_freqs: 1 on the rotated pairs of the full layers, 1e30 on the others (proportional RoPE).
  const uint64_t pairs = h.global_head_dim / 2;
  const auto rotated = static_cast<uint64_t>(static_cast<double>(h.global_head_dim) * h.partial_rotary / 2.0);
  std::vector<float> rope_freqs(pairs, 1e30f);
  std::fill(rope_freqs.begin(), rope_freqs.begin() + static_cast<std::ptrdiff_t>(std::min(rotated, pairs)), 1.0f);
  w.add_tensor("rope_freqs.weight", TensorType::kF32, {pairs});
  for (const auto& p : plan) {
    if (p.int4) {  // the image's INT4 tensors (image/image.h), copied by build_image
      if (p.shape[0] % ct->group_size != 0) {
        throw Error(dir.string() + ": " + p.hf + " has " + std::to_string(p.shape[0]) + " inputs, not a multiple of the group size " +
                    std::to_string(ct->group_size));
      }
      w.add_tensor(p.name + ".q4", TensorType::kI8, {p.shape[0] / 2, p.shape[1]});
      w.add_tensor(p.name + ".scales", TensorType::kF16, {p.shape[0] / ct->group_size, p.shape[1]});
      if (!ct->symmetric) w.add_tensor(p.name + ".mins", TensorType::kF16, {p.shape[0] / ct->group_size, p.shape[1]});
      continue;
    }
    w.add_tensor(p.name, p.type, p.shape);
  }
  if (mtp) mtp->add_header(w);
  w.begin_data();
  w.write({reinterpret_cast<const std::byte*>(rope_freqs.data()), rope_freqs.size() * sizeof(float)});
  for (const auto& p : plan) {
    if (p.int4) {
      write_ct_linear(w, ckpt, p.hf.substr(0, p.hf.size() - std::strlen(".weight")), p.shape[1], p.shape[0], *ct, log);
      continue;
    }
    const auto& info = ckpt.info(p.hf);
    hf::write_tensor(w, ckpt.data(p.hf), info.dtype, std::max<uint64_t>(1, info.n_elements()),
                     !p.one_d && info.dtype != st::Dtype::kF64);
    ckpt.release(p.hf);
  }
  if (mtp) mtp->write_data(w);
  w.finish();
}

}  // namespace kestrel::image
