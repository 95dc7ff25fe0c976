#include "kestrel/runtime/engine.h"

#include <algorithm>
#include <chrono>

#include "kestrel/base/error.h"
#include "kestrel/image/image.h"

namespace kestrel::runtime {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kDefaultContext = 4096;

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

// Maps the file; a Kestrel image's content checksum is verified before anything uses it.
gguf::File open_model_file(const std::filesystem::path& path) {
  gguf::File file = gguf::File::open(path);
  if (image::read_image_info(file)) image::verify_content(file);
  return file;
}

}  // namespace

Engine::Engine(const std::filesystem::path& model_path, const EngineOptions& options)
    : file_(open_model_file(model_path)),
      pool_(options.n_threads),
      model_(model::load_model(file_, options.load, pool_)),
      tokenizer_(text::Tokenizer::from_gguf(file_)) {
  const size_t max_ctx = model_->info().context_length;
  const size_t n_ctx = !options.n_ctx ? std::min<size_t>(kDefaultContext, max_ctx)
                       : *options.n_ctx == 0 ? max_ctx
                                             : *options.n_ctx;
  cache_ = model_->new_cache(n_ctx);
  logits_.resize(model_->info().n_vocab);
  stop_tokens_.push_back(tokenizer_.eos());
  if (auto eot = tokenizer_.find("<end_of_turn>")) stop_tokens_.push_back(*eot);
}

std::vector<TokenId> Engine::encode(std::string_view text, bool special) const {
  return tokenizer_.encode(text, /*add_special=*/true, special);
}

std::span<float> Engine::eval(std::span<const TokenId> tokens) {
  model_->forward(tokens, cache_, model::Logits::kLast, logits_.data(), pool_);
  return logits_;
}

GenerateResult Engine::generate(std::span<const TokenId> prompt, const GenerateOptions& options,
                                const TextCallback& on_text) {
  if (prompt.empty()) throw Error("the prompt is empty");
  if (prompt.size() >= n_ctx()) {
    throw Error("the prompt has " + std::to_string(prompt.size()) +
                " tokens, which does not fit the context of " + std::to_string(n_ctx()) +
                " tokens (raise --ctx or shorten the prompt)");
  }
  GenerateResult result;
  result.prompt_tokens = prompt.size();
  result.finish_reason = "length";
  Sampler sampler(options.sampler);
  std::vector<TokenId> history(prompt.begin(), prompt.end());
  text::StreamDecoder decoder(tokenizer_);
  size_t emitted = 0;
  bool stopped_by_client = false;

  auto emit = [&](size_t end) {
    if (end > emitted && on_text && !on_text(std::string_view(result.text).substr(emitted, end - emitted))) {
      stopped_by_client = true;
    }
    emitted = std::max(emitted, end);
  };

  reset();
  const auto t0 = Clock::now();
  std::span<float> logits = eval(prompt);
  Clock::time_point t_first;
  for (size_t i = 0; i < options.max_tokens; ++i) {
    const TokenId token = sampler.sample(logits, history);
    if (i == 0) {
      t_first = Clock::now();
      result.ttft_ms = ms_since(t0);
    }
    if (options.on_token) options.on_token(token);
    result.tokens.push_back(token);
    history.push_back(token);
    const bool is_stop_token =
        std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end();
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
    if (i + 1 == options.max_tokens || cache_.n_past >= n_ctx()) break;
    const TokenId next[1] = {token};
    logits = eval(next);
  }
  if (result.finish_reason == "length") result.text += decoder.flush();
  emit(result.text.size());
  const size_t n = result.tokens.size();
  result.prefill_tok_s = result.ttft_ms > 0 ? 1000.0 * static_cast<double>(prompt.size()) / result.ttft_ms : 0;
  const double decode_ms = n > 0 ? std::chrono::duration<double, std::milli>(Clock::now() - t_first).count() : 0;
  result.decode_tok_s = n > 1 && decode_ms > 0 ? 1000.0 * static_cast<double>(n - 1) / decode_ms : 0;
  return result;
}

}  // namespace kestrel::runtime
