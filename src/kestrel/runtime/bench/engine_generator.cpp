#include "kestrel/runtime/bench/engine_generator.h"

namespace kestrel::runtime::bench {

std::vector<TokenId> EngineGenerator::generate(const GenerationRequest& request,
                                               const std::function<void(TokenId)>& on_token) {
  GenerateOptions options;
  options.max_tokens = request.output_tokens;
  options.ignore_eos = request.ignore_eos;
  options.draft = draft_;
  options.draft_max = draft_max_;
  if (request.greedy) {
    options.sampler.temperature = 0;
    options.sampler.repeat_penalty = 1;
  }
  if (on_token) {
    options.on_token = [&on_token](TokenId t, const StepLogprobs*) {
      on_token(t);
      return true;
    };
  }
  GenerateResult result = engine_.generate(request.prompt, options);
  drafts_ = {result.drafted_tokens, result.accepted_tokens};
  return std::move(result.tokens);
}

}  // namespace kestrel::runtime::bench
