// POST /v1/embeddings: every input is a prefill on the scheduler (batched with whatever else runs
// there) whose final hidden states are pooled and normalized (runtime/pooling.h).
#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "kestrel/server/app.h"
#include "kestrel/server/embeddings.h"

namespace kestrel::server {

void App::install_embeddings_routes() {
  post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res, const std::string& raw) {
    guarded("embeddings", res, [&] {
      check_auth(req);
      if (!options_.embeddings) {
        throw ApiError(501, "this server does not serve embeddings: start it with `kestrel serve --embeddings` "
                            "(and --pooling mean|last|cls)", "", "embeddings_disabled", "not_supported_error");
      }
      check_ready();
      const EmbeddingsRequest r = parse_embeddings_request(parse_body(raw));
      if (!r.model.empty()) check_model_name(r.model);
      const size_t d_model = engine_->model().info().d_model, n_vocab = engine_->tokenizer().n_vocab();
      if (r.dimensions && static_cast<size_t>(*r.dimensions) != d_model) {
        throw bad_request("'dimensions' must be the model's width, " + std::to_string(d_model) +
                              " (pooled hidden states cannot be shortened)", "dimensions");
      }
      // Strings are tokenized as llama.cpp's embedding does (BOS added, special tokens as text);
      // token ids are used as they are.
      std::vector<std::vector<TokenId>> prompts;
      for (const auto& text : r.inputs.texts) prompts.push_back(engine_->tokenizer().encode(text, true, false));
      for (const auto& ids : r.inputs.ids) {
        for (const int32_t t : ids) {
          if (static_cast<size_t>(t) >= n_vocab) {
            throw bad_request("'input' holds token id " + std::to_string(t) + ", outside the vocabulary of " +
                                  std::to_string(n_vocab), "input");
          }
        }
        prompts.emplace_back(ids.begin(), ids.end());
      }
      for (size_t i = 0; i < prompts.size(); ++i) {
        if (prompts[i].empty()) throw bad_request("'input' " + std::to_string(i) + " has no tokens", "input");
        if (prompts[i].size() >= engine_->n_ctx()) {
          throw bad_request("'input' " + std::to_string(i) + " has " + std::to_string(prompts[i].size()) +
                                " tokens, more than the context of " + std::to_string(engine_->n_ctx()) +
                                " allows (raise --ctx or shorten it)", "input");
        }
      }
      const auto admission = admit();
      runtime::GenerateOptions o;
      o.pooling = pooling_;
      o.max_tokens = 0;
      o.cache_prompt = false;
      o.on_wait = [this] { return !stopping_.load(); };
      // As many inputs in flight as the scheduler has sessions: their prefills share forward passes.
      std::vector<runtime::GenerateResult> results(prompts.size());
      std::atomic<size_t> next{0};
      std::exception_ptr error;
      std::mutex error_mu;
      auto worker = [&] {
        for (size_t i = next++; i < prompts.size(); i = next++) {
          try {
            results[i] = scheduler_->run(prompts[i], o);
          } catch (...) {
            std::lock_guard lock(error_mu);
            if (!error) error = std::current_exception();
            next = prompts.size();
          }
        }
      };
      std::vector<std::thread> threads;
      const size_t n_threads = std::min(prompts.size(), scheduler_->n_sessions());
      for (size_t k = 1; k < n_threads; ++k) threads.emplace_back(worker);
      worker();
      for (auto& t : threads) t.join();
      if (error) std::rethrow_exception(error);
      std::vector<std::vector<float>> vectors;
      size_t prompt_tokens = 0;
      for (auto& result : results) {
        if (result.cancelled || result.embedding.size() != d_model) {
          throw ApiError(503, "the server is stopping; the embeddings were not computed", "", "", "server_error");
        }
        account(result);
        prompt_tokens += result.prompt_tokens;
        vectors.push_back(std::move(result.embedding));
      }
      send_json(res, 200, embeddings_response(vectors, r.base64, r.model.empty() ? options_.model_id : r.model,
                                              prompt_tokens));
    });
  });
}

}  // namespace kestrel::server
