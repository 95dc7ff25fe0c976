#include "kestrel/image/hf_gemma3.h"

#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/formats/gguf_writer.h"
#include "kestrel/formats/safetensors.h"
#include "kestrel/image/hf_common.h"
#include "kestrel/image/hf_awq_gptq.h"
#include "kestrel/image/hf_compressed_tensors.h"
#include "kestrel/image/hf_gemma4.h"

namespace kestrel::image {
namespace {

using gguf::TensorType;
using gguf::Value;
using gguf::ValueType;
using nlohmann::json;
namespace st = safetensors;

// SentencePiece / llama.cpp token types (tokenizer.ggml.token_type).
constexpr int64_t kNormal = 1, kControl = 3, kUserDefined = 4, kByte = 6;

using hf::array;
using hf::boolean;
using hf::f32;
using hf::str;
using hf::u32;

std::string config_name(const std::filesystem::path& dir) { return (dir / "config.json").string(); }

// The text model's config: config.json itself, or its text_config (Gemma3ForConditionalGeneration).
json text_config(const st::Checkpoint& ckpt) {
  const json& c = ckpt.config();
  const std::string type = c.value("model_type", "");
  if (type == "gemma3_text") return c;
  if (type == "gemma3" && c.contains("text_config") && c["text_config"].is_object()) return c["text_config"];
  throw Error(config_name(ckpt.dir()) + ": model_type '" + type +
              "' is not a Gemma 3 text model (kestrel build reads gemma3_text checkpoints)");
}

uint64_t get_uint(const json& c, const char* key, const std::filesystem::path& dir,
                  std::optional<uint64_t> fallback = std::nullopt) {
  return hf::get_uint(c, key, config_name(dir), fallback);
}

double get_float(const json& c, const char* key, const std::filesystem::path& dir, double fallback) {
  return hf::get_float(c, key, config_name(dir), fallback);
}

// Layer i is global when (i + 1) % pattern == 0 (llama.cpp's gemma3 convention).
uint64_t sliding_window_pattern(const json& c, uint64_t n_layers, const std::filesystem::path& dir) {
  if (c.contains("sliding_window_pattern") && c["sliding_window_pattern"].is_number_unsigned()) {
    return c["sliding_window_pattern"].get<uint64_t>();
  }
  if (!c.contains("layer_types") || !c["layer_types"].is_array()) return 6;  // HF's default
  const auto& types = c["layer_types"];
  if (types.size() != n_layers) throw Error(config_name(dir) + ": layer_types has " + std::to_string(types.size()) + " entries for " + std::to_string(n_layers) + " layers");
  uint64_t pattern = 0;
  for (uint64_t i = 0; i < n_layers; ++i) {
    if (types[i] == "full_attention") {
      pattern = i + 1;
      break;
    }
  }
  if (pattern == 0) pattern = n_layers + 1;  // no global layer among these
  for (uint64_t i = 0; i < n_layers; ++i) {
    const bool global = (i + 1) % pattern == 0;
    if (types[i] != (global ? "full_attention" : "sliding_attention")) {
      throw Error(config_name(dir) + ": layer_types is not one global layer every N layers, which Kestrel's gemma3 requires");
    }
  }
  return pattern;
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<double> scores;
  std::vector<int64_t> types;
  std::map<std::string, int64_t> ids;
};

bool is_byte_piece(const std::string& p) {
  static const std::regex re("<0x[0-9A-F]{2}>");
  return p.size() == 6 && std::regex_match(p, re);
}

// tokenizer.json: model.vocab (piece -> id) plus added_tokens. Types: added tokens are CONTROL
// when special, USER_DEFINED otherwise; <0xHH> pieces BYTE; the rest NORMAL. Scores, which only
// tokenizer.model carries: NORMAL pieces get -(their rank among NORMAL pieces in id order),
// which is what Gemma's SentencePiece model holds; BYTE 0; added tokens -1000 (llama.cpp's value).
Vocab read_vocab(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer.json";
  if (!std::filesystem::is_regular_file(path)) {
    throw Error(dir.string() + " has no tokenizer.json (kestrel build reads the vocabulary from it)");
  }
  const json tj = st::read_json(path);
  if (!tj.contains("model") || !tj["model"].is_object() || !tj["model"].contains("vocab") ||
      !tj["model"]["vocab"].is_object()) {
    throw Error(path.string() + " has no model.vocab object (a BPE or SentencePiece-style tokenizer)");
  }
  std::map<int64_t, std::pair<std::string, int64_t>> by_id;  // id -> (piece, type)
  auto put = [&](const std::string& piece, const json& id, int64_t type) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > (1u << 24)) {
      throw Error(path.string() + ": token '" + piece + "' has a bad id");
    }
    by_id[id.get<int64_t>()] = {piece, type};
  };
  for (const auto& [piece, id] : tj["model"]["vocab"].items()) {
    put(piece, id, is_byte_piece(piece) ? kByte : kNormal);
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
  if (by_id.size() != n) {
    throw Error(path.string() + ": token ids are not contiguous (" + std::to_string(by_id.size()) + " tokens, largest id " + std::to_string(n - 1) + ")");
  }
  Vocab v;
  double rank = 0;
  for (const auto& [id, entry] : by_id) {
    v.tokens.push_back(entry.first);
    v.types.push_back(entry.second);
    if (entry.second == kNormal) {
      v.scores.push_back(-rank);
      rank += 1;
    } else {
      v.scores.push_back(entry.second == kByte ? 0.0 : -1000.0);
    }
    v.ids[entry.first] = id;
  }
  return v;
}

// A special token of tokenizer_config.json ("<bos>" or {"content": "<bos>"}), as an id.
std::optional<uint64_t> special_id(const json& tc, const char* key, const Vocab& v) {
  if (!tc.contains(key)) return std::nullopt;
  const json& t = tc[key];
  std::string s;
  if (t.is_string()) s = t.get<std::string>();
  else if (t.is_object() && t.contains("content") && t["content"].is_string()) s = t["content"].get<std::string>();
  else return std::nullopt;
  const auto it = v.ids.find(s);
  if (it == v.ids.end()) return std::nullopt;
  return static_cast<uint64_t>(it->second);
}

std::optional<uint64_t> config_id(const json& c, const char* key) {
  if (!c.contains(key)) return std::nullopt;
  const json& t = c[key].is_array() && !c[key].empty() ? c[key][0] : c[key];
  if (!t.is_number_unsigned()) return std::nullopt;
  return t.get<uint64_t>();
}

// HF name (without the language model prefix) -> GGUF name; empty when not a Gemma 3 tensor.
std::string gguf_name(const std::string& hf) {
  static const std::map<std::string, std::string> kGlobal = {
      {"embed_tokens.weight", "token_embd.weight"}, {"norm.weight", "output_norm.weight"}};
  static const std::map<std::string, std::string> kLayer = {
      {"self_attn.q_proj.weight", "attn_q"}, {"self_attn.k_proj.weight", "attn_k"},
      {"self_attn.v_proj.weight", "attn_v"}, {"self_attn.o_proj.weight", "attn_output"},
      {"self_attn.q_norm.weight", "attn_q_norm"}, {"self_attn.k_norm.weight", "attn_k_norm"},
      {"input_layernorm.weight", "attn_norm"}, {"post_attention_layernorm.weight", "post_attention_norm"},
      {"pre_feedforward_layernorm.weight", "ffn_norm"}, {"post_feedforward_layernorm.weight", "post_ffw_norm"},
      {"mlp.gate_proj.weight", "ffn_gate"}, {"mlp.up_proj.weight", "ffn_up"}, {"mlp.down_proj.weight", "ffn_down"}};
  if (const auto it = kGlobal.find(hf); it != kGlobal.end()) return it->second;
  static const std::regex re("layers\\.([0-9]{1,6})\\.(.+)");
  std::smatch m;
  if (!std::regex_match(hf, m, re)) return "";
  const auto it = kLayer.find(m[2].str());
  if (it == kLayer.end()) return "";
  return "blk." + m[1].str() + "." + it->second + ".weight";
}

bool is_vision(const std::string& name) {
  for (const char* p : {"vision_tower.", "multi_modal_projector.", "multimodal_projector.", "vision_model.",
                        "model.vision_tower.", "model.multi_modal_projector."}) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

std::string strip_prefix(const std::string& name) {
  for (const char* p : {"model.language_model.", "language_model.model.", "model."}) {
    if (name.rfind(p, 0) == 0) return name.substr(std::strlen(p));
  }
  return name;
}

struct Planned {
  std::string hf;    // checkpoint name
  std::string name;  // GGUF name
  int layer = -1;
  std::vector<uint64_t> shape;  // GGUF order
  TensorType type = TensorType::kF32;
  bool norm = false;
  uint64_t rows_kept = 0;  // rows written (the embedding is trimmed to the vocabulary)
  bool int4 = false;       // a compressed-tensors Linear (hf is its module name + ".weight")
};

bool ends_with(const std::string& s, const char* suffix) {
  const size_t k = std::strlen(suffix);
  return s.size() >= k && s.compare(s.size() - k, k, suffix) == 0;
}

}  // namespace

bool is_hf_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) && std::filesystem::is_regular_file(path / "config.json", ec);
}

void write_hf_gemma3_gguf(const std::filesystem::path& dir, const std::filesystem::path& out,
                          const std::function<void(const std::string&)>& log) {
  const st::Checkpoint ckpt = st::Checkpoint::open(dir);
  const json c = text_config(ckpt);
  const uint64_t n_layers = get_uint(c, "num_hidden_layers", dir);
  const uint64_t d_model = get_uint(c, "hidden_size", dir);
  const uint64_t d_ff = get_uint(c, "intermediate_size", dir);
  const uint64_t n_heads = get_uint(c, "num_attention_heads", dir, 8);
  const uint64_t n_kv = get_uint(c, "num_key_value_heads", dir, 4);
  const uint64_t head_dim = get_uint(c, "head_dim", dir, 256);
  if (c.contains("attn_logit_softcapping") && !c["attn_logit_softcapping"].is_null()) {
    throw Error(config_name(dir) + ": attn_logit_softcapping is set, which Gemma 3 does not use");
  }
  if (c.contains("query_pre_attn_scalar") && c["query_pre_attn_scalar"].is_number() &&
      c["query_pre_attn_scalar"].get<double>() != static_cast<double>(head_dim)) {
    throw Error(config_name(dir) + ": query_pre_attn_scalar differs from head_dim; Kestrel's gemma3 scales by 1/sqrt(head_dim)");
  }
  const Vocab vocab = read_vocab(dir);
  const uint64_t n_vocab = vocab.tokens.size();
  // A prequantized W4A16 checkpoint: AWQ / GPTQ (image/hf_awq_gptq.h) or compressed-tensors.
  const std::optional<AwqGptqScheme> ag = awq_gptq_scheme(ckpt.config(), dir);
  const std::optional<CtScheme> ct = ag ? std::nullopt : compressed_tensors_scheme(ckpt.config(), config_name(dir));
  const size_t int4_group = ag ? ag->group_size : ct ? ct->group_size : 0;
  const bool int4_symmetric = ag ? ag->symmetric : ct ? ct->symmetric : true;

  // Plan every tensor: name, shape (checked against config.json), type.
  std::vector<Planned> plan;
  size_t skipped_vision = 0;
  for (const auto& hf : ckpt.names()) {
    if (is_vision(hf)) { ++skipped_vision; continue; }
    const std::string bare = strip_prefix(hf);
    if (bare == "lm_head.weight") {
      if (log) log("skipping " + hf + " (the output head is tied to the embedding)");
      continue;
    }
    Planned p;
    p.hf = hf;
    const CtRole role = ct_role(bare, dir.string() + ": tensor '" + hf + "'");
    if (ct && role == CtRole::kAuxiliary) continue;  // read with their weight_packed
    if (ag && is_awq_gptq_aux(bare)) continue;  // read with their qweight
    std::string bare_weight = bare;
    if (ct && role == CtRole::kPacked) {
      p.int4 = true;
      p.hf = hf.substr(0, hf.size() - std::strlen("_packed"));
      bare_weight = bare.substr(0, bare.size() - std::strlen("_packed"));
    }
    if (ag && ends_with(bare, ".qweight")) {
      p.int4 = true;
      p.hf = hf.substr(0, hf.size() - std::strlen(".qweight")) + ".weight";
      bare_weight = bare.substr(0, bare.size() - std::strlen(".qweight")) + ".weight";
    }
    p.name = gguf_name(bare_weight);
    if (p.name.empty()) throw Error(dir.string() + ": tensor '" + hf + "' is not part of a Gemma 3 text model");
    if (p.int4) {
      if (p.name.rfind("blk.", 0) != 0 || p.name.find("norm") != std::string::npos) {
        throw Error(dir.string() + ": tensor '" + hf + "' is quantized but is not a layer matrix");
      }
      p.layer = std::stoi(p.name.substr(4));
      if (p.layer >= static_cast<int>(n_layers)) throw Error(dir.string() + ": tensor '" + hf + "' is past num_hidden_layers");
      if (ag) {
        const auto [rows, cols] = awq_gptq_linear_shape(ckpt, p.hf.substr(0, p.hf.size() - std::strlen(".weight")), *ag);
        p.shape = {cols, rows};  // GGUF order
      } else {
        const auto shape = ckpt.info(p.hf + "_shape");
        const auto sd = ckpt.data(p.hf + "_shape");
        if (shape.dtype != st::Dtype::kI64 || shape.n_elements() != 2) {
          throw Error(dir.string() + ": " + p.hf + "_shape is not two int64 values");
        }
        int64_t rc[2];
        std::memcpy(rc, sd.data(), sizeof(rc));
        if (rc[0] <= 0 || rc[1] <= 0) throw Error(dir.string() + ": " + p.hf + "_shape is not positive");
        p.shape = {static_cast<uint64_t>(rc[1]), static_cast<uint64_t>(rc[0])};  // GGUF order
      }
      p.rows_kept = p.shape[1];
      const std::string& g = p.name;
      auto ends = [&](const char* x) { return ends_with(g, x); };
      std::vector<uint64_t> want;
      if (ends("attn_q.weight")) want = {n_heads * head_dim, d_model};
      else if (ends("attn_k.weight") || ends("attn_v.weight")) want = {n_kv * head_dim, d_model};
      else if (ends("attn_output.weight")) want = {d_model, n_heads * head_dim};
      else if (ends("ffn_gate.weight") || ends("ffn_up.weight")) want = {d_ff, d_model};
      else if (ends("ffn_down.weight")) want = {d_model, d_ff};
      if (want != std::vector<uint64_t>{p.shape[1], p.shape[0]}) {
        throw Error(dir.string() + ": " + p.hf + "_shape is " + hf::shape_str({p.shape[1], p.shape[0]}) + ", config.json implies " + hf::shape_str(want));
      }
      plan.push_back(std::move(p));
      continue;
    }
    const auto& info = ckpt.info(hf);
    if (p.name.rfind("blk.", 0) == 0) p.layer = std::stoi(p.name.substr(4));
    if (p.layer >= static_cast<int>(n_layers)) throw Error(dir.string() + ": tensor '" + hf + "' is past num_hidden_layers");
    p.norm = p.name.find("norm.weight") != std::string::npos;
    std::vector<uint64_t> want;  // HF order
    const std::string& g = p.name;
    auto ends = [&](const char* s) { return g.size() >= std::strlen(s) && g.compare(g.size() - std::strlen(s), std::strlen(s), s) == 0; };
    if (g == "token_embd.weight") want = {info.shape.empty() ? 0 : std::max(info.shape[0], n_vocab), d_model};
    else if (ends("attn_q_norm.weight") || ends("attn_k_norm.weight")) want = {head_dim};
    else if (p.norm) want = {d_model};
    else if (ends("attn_q.weight")) want = {n_heads * head_dim, d_model};
    else if (ends("attn_k.weight") || ends("attn_v.weight")) want = {n_kv * head_dim, d_model};
    else if (ends("attn_output.weight")) want = {d_model, n_heads * head_dim};
    else if (ends("ffn_gate.weight") || ends("ffn_up.weight")) want = {d_ff, d_model};
    else if (ends("ffn_down.weight")) want = {d_model, d_ff};
    if (info.shape != want) {
      throw Error(dir.string() + ": tensor '" + hf + "' has shape " + hf::shape_str(info.shape) + ", config.json implies " + hf::shape_str(want) +
                  (g == "token_embd.weight" ? " (at least the tokenizer's " + std::to_string(n_vocab) + " rows)" : ""));
    }
    p.type = hf::stored_type(dir, hf, info.dtype, p.norm);  // norms (1-D) as float32
    p.rows_kept = info.shape.size() == 2 ? (g == "token_embd.weight" ? n_vocab : info.shape[0]) : 1;
    p.shape.assign(info.shape.rbegin(), info.shape.rend());
    if (info.shape.size() == 2) p.shape[1] = p.rows_kept;
    plan.push_back(std::move(p));
  }
  if (skipped_vision > 0 && log) log("skipping " + std::to_string(skipped_vision) + " vision tower / projector tensors (text model only)");
  std::sort(plan.begin(), plan.end(), [](const Planned& a, const Planned& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.name < b.name;
  });
  for (size_t i = 1; i < plan.size(); ++i) {
    if (plan[i].name == plan[i - 1].name) throw Error(dir.string() + ": tensors '" + plan[i - 1].hf + "' and '" + plan[i].hf + "' both map to " + plan[i].name);
  }
  {
    std::vector<std::string> required = {"token_embd.weight", "output_norm.weight"};
    for (uint64_t il = 0; il < n_layers; ++il) {
      for (const char* t : {"attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "attn_norm",
                            "post_attention_norm", "ffn_norm", "post_ffw_norm", "ffn_gate", "ffn_up", "ffn_down"}) {
        required.push_back("blk." + std::to_string(il) + "." + t + ".weight");
      }
    }
    for (const auto& r : required) {
      if (std::none_of(plan.begin(), plan.end(), [&](const Planned& p) { return p.name == r; })) {
        throw Error(dir.string() + ": the checkpoint has no tensor for " + r);
      }
    }
  }

  // Metadata, in the order llama.cpp's converter writes it.
  gguf::Writer w(out, 32);
  w.add("general.architecture", str("gemma3"));
  w.add("general.type", str("model"));
  w.add("general.name", str(dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string()));
  w.add("gemma3.context_length", u32(get_uint(c, "max_position_embeddings", dir, 131072)));
  w.add("gemma3.embedding_length", u32(d_model));
  w.add("gemma3.block_count", u32(n_layers));
  w.add("gemma3.feed_forward_length", u32(d_ff));
  w.add("gemma3.attention.head_count", u32(n_heads));
  w.add("gemma3.attention.layer_norm_rms_epsilon", f32(get_float(c, "rms_norm_eps", dir, 1e-6)));
  w.add("gemma3.attention.key_length", u32(head_dim));
  w.add("gemma3.attention.value_length", u32(head_dim));
  w.add("gemma3.rope.freq_base", f32(get_float(c, "rope_theta", dir, 1e6)));
  w.add("gemma3.attention.sliding_window", u32(get_uint(c, "sliding_window", dir)));
  w.add("gemma3.attention.head_count_kv", u32(n_kv));
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) {
    const json& rs = c["rope_scaling"];
    const std::string type = rs.value("rope_type", rs.value("type", ""));
    if (type != "linear") throw Error(config_name(dir) + ": rope_scaling type '" + type + "' is not linear, the only one Gemma 3 uses");
    w.add("gemma3.rope.scaling.type", str("linear"));
    w.add("gemma3.rope.scaling.factor", f32(get_float(rs, "factor", dir, 1.0)));
  }
  if (c.contains("final_logit_softcapping") && c["final_logit_softcapping"].is_number()) {
    w.add("gemma3.final_logit_softcapping", f32(c["final_logit_softcapping"].get<double>()));
  }
  w.add("gemma3.rope.freq_base_swa", f32(get_float(c, "rope_local_base_freq", dir, 1e4)));
  w.add("gemma3.attention.sliding_window_pattern", u32(sliding_window_pattern(c, n_layers, dir)));

  const json tc = hf::read_tokenizer_config(dir);
  w.add("tokenizer.ggml.model", str("llama"));
  w.add("tokenizer.ggml.pre", str("default"));
  w.add("tokenizer.ggml.tokens", array(ValueType::kString, vocab.tokens));
  w.add("tokenizer.ggml.scores", array(ValueType::kFloat32, vocab.scores));
  w.add("tokenizer.ggml.token_type", array(ValueType::kInt32, vocab.types));
  const json& cfg = ckpt.config();
  const std::pair<const char*, const char*> specials[] = {
      {"bos_token", "bos_token_id"}, {"eos_token", "eos_token_id"}, {"unk_token", nullptr}, {"pad_token", "pad_token_id"}};
  const char* keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                        "tokenizer.ggml.padding_token_id"};
  for (size_t i = 0; i < 4; ++i) {
    auto id = special_id(tc, specials[i].first, vocab);
    if (!id && specials[i].second) id = config_id(cfg, specials[i].second);
    if (id && *id < n_vocab) w.add(keys[i], u32(*id));
  }
  w.add("tokenizer.ggml.add_bos_token", boolean(tc.value("add_bos_token", true)));
  w.add("tokenizer.ggml.add_sep_token", boolean(false));
  w.add("tokenizer.ggml.add_eos_token", boolean(tc.value("add_eos_token", false)));
  std::string chat_template;
  if (tc.contains("chat_template") && tc["chat_template"].is_string()) chat_template = tc["chat_template"].get<std::string>();
  if (chat_template.empty() && std::filesystem::is_regular_file(dir / "chat_template.jinja")) {
    std::ifstream in(dir / "chat_template.jinja", std::ios::binary);
    chat_template.assign(std::istreambuf_iterator<char>(in), {});
  }
  if (!chat_template.empty()) w.add("tokenizer.chat_template", str(chat_template));
  w.add("tokenizer.ggml.add_space_prefix", boolean(false));
  w.add("general.quantization_version", u32(2));
  const auto& embd = ckpt.info(plan[static_cast<size_t>(std::find_if(plan.begin(), plan.end(), [](const Planned& p) { return p.name == "token_embd.weight"; }) - plan.begin())].hf);
  w.add("general.file_type", u32(embd.dtype == st::Dtype::kBF16 ? 32 : embd.dtype == st::Dtype::kF16 ? 1 : 0));

  for (const auto& p : plan) {
    if (p.int4) {  // the image's INT4 tensors (image/image.h), copied by build_image
      w.add_tensor(p.name + ".q4", TensorType::kI8, {p.shape[0] / 2, p.shape[1]});
      w.add_tensor(p.name + ".scales", TensorType::kF16, {p.shape[0] / int4_group, p.shape[1]});
      if (!int4_symmetric) w.add_tensor(p.name + ".mins", TensorType::kF16, {p.shape[0] / int4_group, p.shape[1]});
      continue;
    }
    w.add_tensor(p.name, p.type, p.shape);
  }
  w.begin_data();
  for (const auto& p : plan) {
    if (p.int4 && ag) {
      write_awq_gptq_linear(w, ckpt, p.hf.substr(0, p.hf.size() - std::strlen(".weight")), p.shape[1], p.shape[0], *ag, log);
      continue;
    }
    if (p.int4) {
      write_ct_linear(w, ckpt, p.hf.substr(0, p.hf.size() - std::strlen(".weight")), p.shape[1], p.shape[0], *ct, log);
      continue;
    }
    const auto& info = ckpt.info(p.hf);
    const uint64_t row_elems = info.shape.size() == 2 ? info.shape[1] : info.n_elements();
    hf::write_tensor(w, ckpt.data(p.hf), info.dtype, p.rows_kept * row_elems,
                     !p.norm && info.dtype != st::Dtype::kF64, p.norm ? 1.0f : 0.0f);
    ckpt.release(p.hf);
  }
  w.finish();
}

BuildReport build_image_from_hf(const std::filesystem::path& dir, const std::filesystem::path& out,
                                const BuildOptions& options, ThreadPool& pool,
                                const std::function<void(const std::string&)>& log) {
  // The intermediate GGUF lives in a private directory next to the output (same filesystem,
  // nothing else in it for build_image's licence scan to pick up).
  const auto parent = out.has_parent_path() ? out.parent_path() : std::filesystem::path(".");
  std::string templ = (parent / ".kestrel-hf-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) throw Error("cannot create a temporary directory in " + parent.string());
  const std::filesystem::path tmp_dir(templ);
  const std::string base = std::filesystem::absolute(dir).lexically_normal().filename().string();
  const auto gguf_path = tmp_dir / ((base.empty() ? std::string("checkpoint") : base) + ".gguf");
  BuildOptions opts = options;
  opts.source_name = (base.empty() ? std::string("checkpoint") : base) + "/";  // a directory, not the GGUF made from it
  {
    const st::Checkpoint ckpt = st::Checkpoint::open(dir);
    const auto ag = awq_gptq_scheme(ckpt.config(), dir);
    if (ag && is_hf_gemma4(dir)) {
      throw Error(dir.string() + " is a " + ag->name + " checkpoint of Gemma 4: kestrel build imports AWQ and GPTQ "
                  "checkpoints of Gemma 3, and compressed-tensors (pack-quantized W4A16) checkpoints of both");
    }
    if (ag) {
      // As for compressed-tensors below: the checkpoint's integers and scales are kept.
      if (opts.precision != quant::Precision::kW4A16 || opts.scale_bits != 16) {
        throw Error(dir.string() + " is a " + ag->name + " W4A16 checkpoint: it builds as --precision w4a16 with "
                    "16-bit scales (its integers and scales are kept as they are)");
      }
      if (log && (opts.group_size != ag->group_size || opts.zero_points == ag->symmetric)) {
        log(ag->name + " checkpoint: group size " + std::to_string(ag->group_size) +
            (ag->symmetric ? ", symmetric" : ", integer zero points") + " (the checkpoint's, kept exactly)");
      }
      opts.group_size = ag->group_size;
      opts.zero_points = !ag->symmetric;
      opts.integer_zero_points = !ag->symmetric;  // Linears the checkpoint keeps dense
      opts.source_quant_method = ag->name;
    } else if (const auto ct = compressed_tensors_scheme(ckpt.config(), config_name(dir))) {
      // The checkpoint's own integers and scales are kept: the image takes its group size and
      // zero points; the Linears it keeps dense are quantized with integer zero points too.
      if (opts.precision != quant::Precision::kW4A16 || opts.scale_bits != 16) {
        throw Error(dir.string() + " is a compressed-tensors W4A16 checkpoint: it builds as --precision w4a16 with "
                    "16-bit scales (its integers and scales are kept as they are)");
      }
      if (log && (opts.group_size != ct->group_size || opts.zero_points == ct->symmetric)) {
        log("compressed-tensors checkpoint: group size " + std::to_string(ct->group_size) +
            (ct->symmetric ? ", symmetric" : ", integer zero points") + " (the checkpoint's, kept exactly)");
      }
      opts.group_size = ct->group_size;
      opts.zero_points = !ct->symmetric;
      opts.integer_zero_points = !ct->symmetric;  // matrices the checkpoint keeps dense (its `ignore`)
    }
  }
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    if (entry.is_regular_file() && (name.rfind("LICENSE", 0) == 0 || name.rfind("LICENCE", 0) == 0 ||
                                    name.rfind("NOTICE", 0) == 0 || name.rfind("COPYING", 0) == 0 ||
                                    name.find("TERMS") != std::string::npos)) {
      opts.license_files.push_back(entry.path());
    }
  }
  if (!opts.assistant.empty() && !is_hf_gemma4(dir)) {
    std::filesystem::remove_all(tmp_dir, ec);
    throw Error("kestrel build: --assistant is for Gemma 4 targets; " + dir.string() + " is not a Gemma 4 checkpoint");
  }
  try {
    if (is_hf_gemma4(dir)) {
      write_hf_gemma4_gguf(dir, gguf_path, log, opts.assistant);  // image/hf_gemma4.h
      opts.assistant.clear();
    } else {
      write_hf_gemma3_gguf(dir, gguf_path, log);
    }
    BuildReport report = build_image(gguf_path, out, opts, pool);
    report.source_bytes = st::Checkpoint::open(dir).bytes();
    std::filesystem::remove_all(tmp_dir, ec);
    return report;
  } catch (...) {
    std::filesystem::remove_all(tmp_dir, ec);
    throw;
  }
}

}  // namespace kestrel::image
