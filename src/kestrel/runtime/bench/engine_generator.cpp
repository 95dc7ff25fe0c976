#include "kestrel/runtime/bench/engine_generator.h"

namespace kestrel::runtime::bench {

std::vector<TokenId> EngineGenerator::generate(const GenerationRequest& request,
                                               const std::function<void(TokenId)>& on_token) {
  GenerateOptions options;
  options.max_tokens = request.output_tokens;
  options.ignore_eos = request.ignore_eos;
  if (request.greedy) {
    options.sampler.temperature = 0;
    options.sampler.repeat_penalty = 1;
  }
  options.on_token = on_token;
  return engine_.generate(request.prompt, options).tokens;
}

}  // namespace kestrel::runtime::bench
