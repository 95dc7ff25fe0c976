#include "kestrel/runtime/session.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kestrel/base/error.h"
#include "kestrel/runtime/engine.h"

namespace kestrel::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string: that
// much text must be held back while streaming, as the next token may complete the match.
size_t held_back(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& stop : stops) {
    for (size_t len = std::min(stop.size() - 1, text.size()); len > hold; --len) {
      if (text.substr(text.size() - len) == std::string_view(stop).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

}  // namespace

Session::Session(Engine& engine)
    : engine_(engine),
      cache_(engine.model().new_cache(engine.n_ctx())),
      logits_(engine.model().info().n_vocab),
      hidden_(engine.model().info().d_model) {}

// Serving: stop tokens get -inf so that min_tokens tokens come before the end of the turn.
void Session::suppress_stop_tokens(TokenScores scores, const GenerateOptions& options) const {
  for (const auto* ids : {&engine_.stop_tokens(), &options.stop_token_ids}) {
    for (TokenId t : *ids) {
      if (scores.ids.empty()) {
        if (t >= 0 && static_cast<size_t>(t) < scores.size()) scores.logits[static_cast<size_t>(t)] = -INFINITY;
      } else {
        for (size_t i = 0; i < scores.size(); ++i) {
          if (scores.ids[i] == t) scores.logits[i] = -INFINITY;
        }
      }
    }
  }
}

std::span<float> Session::eval(std::span<const TokenId> tokens) {
  engine_.model().forward(tokens, cache_, model::Logits::kLast, logits_.data(), engine_.pool());
  return logits_;
}

TokenScores Session::step(std::span<const TokenId> tokens) {
  const head::FlashHead* flash = engine_.flashhead();
  if (flash == nullptr) {
    eval(tokens);
    return {logits_, {}};
  }
  engine_.model().forward_hidden(tokens, cache_, model::Logits::kLast, hidden_.data(), engine_.pool());
  flash->search(hidden_.data(), engine_.probes(), candidates_, engine_.pool());
  return {candidates_.logits, candidates_.ids};
}

size_t Session::reusable_prefix(std::span<const TokenId> prompt) const {
  if (prompt.empty()) return 0;
  return cache_.exact_prefix(std::min(model::common_prefix(cache_.tokens(), prompt), prompt.size() - 1));
}

size_t Session::reuse_prefix(std::span<const TokenId> prompt) {
  if (prompt.empty()) return 0;
  return cache_.truncate(std::min(model::common_prefix(cache_.tokens(), prompt), prompt.size() - 1));
}

GenerateResult Session::generate(std::span<const TokenId> prompt, const GenerateOptions& options,
                                const TextCallback& on_text) {
  if (prompt.empty()) throw Error("the prompt is empty");
  if (prompt.size() >= engine_.n_ctx()) {
    throw Error("the prompt has " + std::to_string(prompt.size()) +
                " tokens, which does not fit the context of " + std::to_string(engine_.n_ctx()) +
                " tokens (raise --ctx or shorten the prompt)");
  }
  GenerateResult result;
  result.prompt_tokens = prompt.size();
  result.finish_reason = "length";
  Sampler sampler(options.sampler);
  std::vector<TokenId> history(prompt.begin(), prompt.end());
  text::StreamDecoder decoder(engine_.tokenizer(), options.render_special);
  const std::vector<TokenId>& stop_tokens = engine_.stop_tokens();
  size_t emitted = 0;
  bool stopped_by_client = false;

  auto emit = [&](size_t end) {
    if (end > emitted && on_text && !on_text(std::string_view(result.text).substr(emitted, end - emitted))) {
      stopped_by_client = true;
    }
    emitted = std::max(emitted, end);
  };

  const auto t0 = Clock::now();
  if (options.cache_prompt) {
    result.cached_tokens = reuse_prefix(prompt);
  } else {
    reset();
  }
  TokenScores scores = step(prompt.subspan(result.cached_tokens));
  Clock::time_point t_first;
  std::vector<float> raw_logits;  // serving: the model's logits before penalties, for logprobs
  std::vector<TokenId> raw_ids;   // their token ids when FlashHead scored a candidate set
  for (size_t i = 0; i < options.max_tokens; ++i) {
    if (options.top_logprobs >= 0) {
      raw_logits.assign(scores.logits.begin(), scores.logits.end());
      raw_ids.assign(scores.ids.begin(), scores.ids.end());
    }
    if (i < options.min_tokens && !options.ignore_eos) suppress_stop_tokens(scores, options);
    const TokenId token = sampler.sample(scores, history);
    if (i == 0) {
      t_first = Clock::now();
      result.ttft_ms = ms_since(t0);
    }
    result.tokens.push_back(token);
    history.push_back(token);
    if (options.top_logprobs >= 0) {
      result.logprobs.push_back(compute_logprobs(raw_logits, raw_ids, token, static_cast<size_t>(options.top_logprobs)));
    }
    if (options.on_token && !options.on_token(token, options.top_logprobs >= 0 ? &result.logprobs.back() : nullptr)) {
      stopped_by_client = true;
      break;
    }
    const bool is_stop_token =
        std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end() ||
        std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), token) != options.stop_token_ids.end();
    if (is_stop_token && !options.ignore_eos) {
      result.finish_reason = "stop";
      break;
    }
    result.text += decoder.push(token);
    bool stop_string = false;
    for (const auto& stop : options.stop) {
      if (stop.empty()) continue;
      const size_t from = emitted > stop.size() ? emitted - stop.size() : 0;
      const size_t at = result.text.find(stop, from);
      if (at != std::string::npos) {
        result.text.resize(at);
        stop_string = true;
      }
    }
    if (stop_string) {
      result.finish_reason = "stop";
      break;
    }
    emit(result.text.size() - held_back(result.text, options.stop));
    if (stopped_by_client) break;
    if (i + 1 == options.max_tokens || cache_.n_past >= engine_.n_ctx()) break;
    const TokenId next[1] = {token};
    scores = step(next);
  }
  if (result.finish_reason == "length") result.text += decoder.flush();
  if (!stopped_by_client) emit(result.text.size());
  result.cancelled = stopped_by_client;
  const size_t n = result.tokens.size();
  const size_t prefilled = prompt.size() - result.cached_tokens;
  result.prefill_tok_s = result.ttft_ms > 0 ? 1000.0 * static_cast<double>(prefilled) / result.ttft_ms : 0;
  const double decode_ms = n > 0 ? std::chrono::duration<double, std::milli>(Clock::now() - t_first).count() : 0;
  result.decode_tok_s = n > 1 && decode_ms > 0 ? 1000.0 * static_cast<double>(n - 1) / decode_ms : 0;
  return result;
}

}  // namespace kestrel::runtime
