#include "kestrel/server/openai_format.h"

namespace kestrel::server {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump(j) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

json usage_json(size_t prompt_tokens, size_t completion_tokens, size_t cached_tokens, size_t drafted_tokens,
                size_t accepted_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}},
          {"completion_tokens_details",
           {{"accepted_prediction_tokens", accepted_tokens},
            {"rejected_prediction_tokens", drafted_tokens - accepted_tokens}}}};
}

json chat_chunk(const ResponseMeta& meta, const json& delta, const std::string& finish_reason, const json& logprobs,
                bool include_usage) {
  json choice = {{"index", 0},
                 {"delta", delta},
                 {"logprobs", logprobs},
                 {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  json chunk = {{"id", meta.id},
                {"object", "chat.completion.chunk"},
                {"created", meta.created},
                {"model", meta.model},
                {"system_fingerprint", "kestrel-" KESTREL_VERSION},
                {"choices", json::array({choice})}};
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json usage_chunk(const ResponseMeta& meta, const char* object, const json& usage) {
  return {{"id", meta.id},
          {"object", object},
          {"created", meta.created},
          {"model", meta.model},
          {"system_fingerprint", "kestrel-" KESTREL_VERSION},
          {"choices", json::array()},
          {"usage", usage}};
}

json completion_choice(size_t index, const std::string& text, const std::string& finish_reason, const json& logprobs) {
  return {{"index", index},
          {"text", text},
          {"logprobs", logprobs},
          {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
}

json completion_object(const ResponseMeta& meta, json choices, const json& usage) {
  json out = {{"id", meta.id},
              {"object", "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"system_fingerprint", "kestrel-" KESTREL_VERSION},
              {"choices", std::move(choices)}};
  if (!usage.is_null()) out["usage"] = usage;
  return out;
}

namespace {

json bytes_of(const std::string& piece) {
  json b = json::array();
  for (unsigned char c : piece) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

json chat_logprobs(const text::Tokenizer& tokenizer, const std::vector<runtime::StepLogprobs>& steps) {
  json content = json::array();
  for (const auto& s : steps) {
    const std::string piece = tokenizer.token_to_piece(s.chosen.token);
    json top = json::array();
    for (const auto& t : s.top) {
      const std::string p = tokenizer.token_to_piece(t.token);
      top.push_back({{"token", p}, {"logprob", t.logprob}, {"bytes", bytes_of(p)}});
    }
    content.push_back({{"token", piece}, {"logprob", s.chosen.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json completion_logprobs(const text::Tokenizer& tokenizer, const std::vector<runtime::StepLogprobs>& steps,
                         size_t offset0) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  size_t offset = offset0;
  for (const auto& s : steps) {
    const std::string piece = tokenizer.token_to_piece(s.chosen.token);
    tokens.push_back(piece);
    token_logprobs.push_back(s.chosen.logprob);
    offsets.push_back(offset);
    offset += piece.size();
    json alternatives = json::object();
    for (const auto& t : s.top) alternatives[tokenizer.token_to_piece(t.token)] = t.logprob;
    top.push_back(s.top.empty() ? json(nullptr) : alternatives);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json echo_completion_logprobs(const text::Tokenizer& tokenizer, std::span<const runtime::TokenId> prompt,
                              const std::vector<runtime::StepLogprobs>& prompt_steps,
                              const std::vector<runtime::StepLogprobs>& generated) {
  json out = completion_logprobs(tokenizer, {}, 0);
  size_t offset = 0;
  auto add = [&](runtime::TokenId token, const runtime::StepLogprobs* s) {
    const std::string piece = tokenizer.token_to_piece(token);
    out["tokens"].push_back(piece);
    out["text_offset"].push_back(offset);
    offset += piece.size();
    out["token_logprobs"].push_back(s ? json(s->chosen.logprob) : json(nullptr));
    if (s == nullptr || s->top.empty()) {
      out["top_logprobs"].push_back(nullptr);
      return;
    }
    json alternatives = json::object();
    for (const auto& t : s->top) alternatives[tokenizer.token_to_piece(t.token)] = t.logprob;
    out["top_logprobs"].push_back(alternatives);
  };
  for (size_t i = 0; i < prompt.size(); ++i) add(prompt[i], i == 0 || i > prompt_steps.size() ? nullptr : &prompt_steps[i - 1]);
  for (const auto& s : generated) add(s.chosen.token, &s);
  return out;
}

json vllm_prompt_logprobs(const text::Tokenizer& tokenizer, const std::vector<runtime::StepLogprobs>& steps,
                          const std::vector<uint32_t>& ranks) {
  json out = json::array({nullptr});
  for (size_t i = 0; i < steps.size(); ++i) {
    json position = json::object();
    for (size_t k = 0; k < steps[i].top.size(); ++k) {
      const auto& t = steps[i].top[k];
      position[std::to_string(t.token)] = {{"logprob", t.logprob}, {"rank", k + 1},
                                           {"decoded_token", tokenizer.token_to_piece(t.token)}};
    }
    const auto& chosen = steps[i].chosen;
    position[std::to_string(chosen.token)] = {{"logprob", chosen.logprob},
                                              {"rank", i < ranks.size() ? ranks[i] : 0},
                                              {"decoded_token", tokenizer.token_to_piece(chosen.token)}};
    out.push_back(position);
  }
  return out;
}

}  // namespace kestrel::server
