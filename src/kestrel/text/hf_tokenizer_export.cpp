#include "kestrel/text/hf_tokenizer_export.h"

#include <algorithm>
#include <fstream>
#include <unordered_map>

#include "kestrel/base/error.h"
#include "kestrel/text/tokenizer.h"

namespace kestrel::text {
namespace {

using nlohmann::json;

// Byte length of the UTF-8 character that starts with `lead` (1 for a stray continuation byte).
size_t utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw Error("cannot write " + path.string());
}

std::string dump(const json& j, int indent) { return j.dump(indent, ' ', false, json::error_handler_t::replace) + "\n"; }

}  // namespace

const std::string& gemma3_jinja_template() {
  // Same output as render_gemma3: a leading system message is folded into the first user
  // turn (or is the user turn when no other message follows), content is trimmed, assistant is
  // written "model", roles must alternate.
  static const std::string kTemplate =
      "{{ bos_token }}"
      "{%- set sys = '' -%}{%- set msgs = messages -%}"
      "{%- if messages and messages[0]['role'] == 'system' -%}"
      "{%- set sys = messages[0]['content'] + '\\n\\n' -%}{%- set msgs = messages[1:] -%}"
      "{%- endif -%}"
      "{%- for m in msgs -%}"
      "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
      "{%- endif -%}"
      "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}"
      "{{ (sys if loop.first else '') + (m['content'] | trim) + '<end_of_turn>\\n' }}"
      "{%- endfor -%}"
      "{%- if sys and not msgs and (messages[0]['content'] | trim) -%}"
      "{{ '<start_of_turn>user\\n' + (messages[0]['content'] | trim) + '<end_of_turn>\\n' }}"
      "{%- endif -%}"
      "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}";
  return kTemplate;
}

json hf_tokenizer_json(const gguf::File& file) {
  const Tokenizer tok = Tokenizer::from_gguf(file);  // validates the arrays
  const size_t n = tok.n_vocab();
  const std::vector<float> scores =
      file.has("tokenizer.ggml.scores") ? file.get_float_array("tokenizer.ggml.scores") : std::vector<float>(n, 0.0f);
  const bool add_space_prefix = file.find_bool("tokenizer.ggml.add_space_prefix").value_or(true);

  json vocab = json::object();
  json added = json::array();
  std::unordered_map<std::string_view, TokenId> index;
  index.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<TokenId>(i);
    const std::string& piece = tok.piece(id);
    vocab[piece] = id;
    index.emplace(piece, id);  // the first id of a duplicated piece, as vocab[] keeps the last
    const TokenType t = tok.type(id);
    if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUserDefined) {
      added.push_back({{"id", id},
                       {"content", piece},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", t != TokenType::kUserDefined}});
    }
  }

  // Merges: (left, right) for every split of a normal or unused piece into two pieces, the
  // piece's score as priority. SentencePiece-BPE merges the pair whose result scores highest.
  struct Merge {
    float score;
    TokenId merged;
    size_t cut;
  };
  std::vector<Merge> merges;
  // Gemma 4's BPE (tokenizer.ggml.model "gemma4", text/bpe.h) has explicit merges in rank order.
  const bool ranked = file.find_string("tokenizer.ggml.model").value_or("") == "gemma4";
  json merge_list = json::array();
  if (ranked) {
    for (const auto& m : file.get_string_array("tokenizer.ggml.merges")) {
      const size_t sp = m.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == m.size()) throw Error("tokenizer.ggml.merges: '" + m + "' is not 'left right'");
      merge_list.push_back(json::array({m.substr(0, sp), m.substr(sp + 1)}));
    }
  }
  for (size_t i = 0; i < n && !ranked; ++i) {
    const auto id = static_cast<TokenId>(i);
    const TokenType t = tok.type(id);
    if (t != TokenType::kNormal && t != TokenType::kUnused) continue;
    const std::string& piece = tok.piece(id);
    for (size_t cut = utf8_len(static_cast<unsigned char>(piece[0])); cut < piece.size();
         cut += utf8_len(static_cast<unsigned char>(piece[cut]))) {
      const std::string_view left(piece.data(), cut), right(piece.data() + cut, piece.size() - cut);
      if (index.count(left) && index.count(right)) merges.push_back({scores[i], id, cut});
    }
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) { return a.score > b.score; });
  for (const auto& m : merges) {
    const std::string& piece = tok.piece(m.merged);
    merge_list.push_back(json::array({piece.substr(0, m.cut), piece.substr(m.cut)}));
  }

  const std::string space = "\xe2\x96\x81";
  json normalizer;
  if (add_space_prefix) {
    normalizer = {{"type", "Sequence"},
                  {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", space}},
                                               {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}}})}};
  } else {
    normalizer = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}};
  }
  // Gemma 4 splits runs of newlines from the rest first (llama.cpp's gemma4 pre-tokenizer).
  json pre_tokenizer = nullptr;
  if (ranked) {
    pre_tokenizer = {{"type", "Split"}, {"pattern", {{"Regex", "\n+"}}}, {"behavior", "Isolated"}, {"invert", false}};
  }
  json post = nullptr;
  if (tok.add_bos() && tok.bos() >= 0) {
    const std::string bos = tok.piece(tok.bos());
    post = {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair", json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                  {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                                  {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
            {"special_tokens", {{bos, {{"id", bos}, {"ids", json::array({tok.bos()})}, {"tokens", json::array({bos})}}}}}};
  }
  json decoder = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
                                            {{"type", "ByteFallback"}},
                                            {{"type", "Fuse"}}})}};
  const std::string unk = tok.piece(static_cast<TokenId>(
      file.find_uint("tokenizer.ggml.unknown_token_id").value_or(0) < n ? file.find_uint("tokenizer.ggml.unknown_token_id").value_or(0) : 0));
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", normalizer},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", post},
          {"decoder", decoder},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", unk},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merge_list}}}};
}

void export_hf_tokenizer(const gguf::File& file, const std::filesystem::path& dir, size_t model_max_length,
                         MissingChatTemplate missing) {
  const json tokenizer = hf_tokenizer_json(file);
  const Tokenizer tok = Tokenizer::from_gguf(file);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create " + dir.string() + ": " + ec.message());
  auto piece_of = [&](const char* key, const char* fallback) -> json {
    const auto id = file.find_uint(key);
    if (id && *id < tok.n_vocab()) return tok.piece(static_cast<TokenId>(*id));
    return fallback ? json(fallback) : json(nullptr);
  };
  const json special = {{"bos_token", piece_of("tokenizer.ggml.bos_token_id", nullptr)},
                        {"eos_token", piece_of("tokenizer.ggml.eos_token_id", nullptr)},
                        {"unk_token", piece_of("tokenizer.ggml.unknown_token_id", nullptr)},
                        {"pad_token", piece_of("tokenizer.ggml.padding_token_id", nullptr)}};
  json config = special;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  config["add_bos_token"] = tok.add_bos();
  config["add_eos_token"] = file.find_bool("tokenizer.ggml.add_eos_token").value_or(false);
  config["model_max_length"] = model_max_length;
  config["clean_up_tokenization_spaces"] = false;
  if (const auto own = file.find_string("tokenizer.chat_template")) {
    config["chat_template"] = *own;
  } else if (missing == MissingChatTemplate::kGemma3) {
    config["chat_template"] = gemma3_jinja_template();
  }
  config["padding_side"] = "left";
  write_file(dir / "tokenizer.json", dump(tokenizer, -1));
  write_file(dir / "tokenizer_config.json", dump(config, 2));
  write_file(dir / "special_tokens_map.json", dump(special, 2));
}

}  // namespace kestrel::text
