// The benchmark's generator for a real model: runtime::Engine::generate, greedy, EOS ignored.
#pragma once

#include "kestrel/runtime/bench/methodology.h"
#include "kestrel/runtime/engine.h"

namespace kestrel::runtime::bench {

/// Runs each request through engine.generate() (a fresh KV cache per call), temperature 0,
/// ignore_eos as requested, reporting each token through GenerateOptions::on_token.
class EngineGenerator final : public Generator {
 public:
  explicit EngineGenerator(Engine& engine) : engine_(engine) {}
  std::vector<TokenId> generate(const GenerationRequest& request,
                                const std::function<void(TokenId)>& on_token) override;

 private:
  Engine& engine_;
};

}  // namespace kestrel::runtime::bench
