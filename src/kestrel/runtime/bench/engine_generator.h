// The benchmark's generator for a real model: runtime::Engine::generate, greedy, EOS ignored.
#pragma once

#include "kestrel/runtime/bench/methodology.h"
#include "kestrel/runtime/engine.h"

namespace kestrel::runtime::bench {

/// Runs each request through engine.generate() (a fresh KV cache per call), temperature 0,
/// ignore_eos as requested, reporting each token through GenerateOptions::on_token. With a
/// draft mode other than none, speculative decoding (the same tokens; last_drafts() counts).
class EngineGenerator final : public Generator {
 public:
  explicit EngineGenerator(Engine& engine, DraftMode draft = DraftMode::kNone, size_t draft_max = kMaxDraft)
      : engine_(engine), draft_(draft), draft_max_(draft_max) {}
  std::vector<TokenId> generate(const GenerationRequest& request,
                                const std::function<void(TokenId)>& on_token) override;
  Drafts last_drafts() const override { return drafts_; }

 private:
  Engine& engine_;
  DraftMode draft_;
  size_t draft_max_;
  Drafts drafts_;
};

}  // namespace kestrel::runtime::bench
