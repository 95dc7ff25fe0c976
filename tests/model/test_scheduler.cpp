// Continuous batching (runtime/scheduler.h) on the default model: requests run together give
// each the answer it gets alone (greedy), a cancelled request stops without disturbing the
// others, more requests than sessions wait their turn, and errors reach only their caller.
#include <gtest/gtest.h>

#include "kestrel/kernels/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "default_engine.h"
#include "kestrel/base/error.h"
#include "kestrel/runtime/model_path.h"
#include "kestrel/runtime/scheduler.h"

namespace kestrel::runtime {
namespace {

class Batching : public WithDefaultEngine<1024> {
 protected:
  static GenerateOptions greedy(size_t n) {
    GenerateOptions o;
    o.max_tokens = n;
    o.sampler.temperature = 0;
    o.ignore_eos = true;
    return o;
  }
  std::vector<std::vector<TokenId>> prompts() const {
    std::vector<std::vector<TokenId>> p;
    for (const char* text : {"The capital of France is", "def fibonacci(n):",
                             "Once upon a time, in a small village by the sea,",
                             "List of prime numbers: 2, 3, 5,"}) {
      p.push_back(engine_->encode(text, false));
    }
    // A long prompt, prefilled in chunks between the others' decode steps.
    std::string long_text;
    for (int i = 0; i < 20; ++i) long_text += "Paragraph " + std::to_string(i) + " of the report discusses the harvest. ";
    p.push_back(engine_->encode(long_text, false));
    return p;
  }
};

TEST_F(Batching, EachRequestAnswersAsItDoesAlone) {
  const auto ps = prompts();
  std::vector<std::vector<TokenId>> alone;
  for (const auto& p : ps) alone.push_back(engine_->session().generate(p, greedy(16)).tokens);

  std::vector<std::vector<TokenId>> together(ps.size());
  {
    Scheduler scheduler(*engine_, {.n_sessions = 4, .prefill_chunk = 16});
    std::vector<std::thread> clients;
    for (size_t i = 0; i < ps.size(); ++i) {
      clients.emplace_back([&, i] { together[i] = scheduler.run(ps[i], greedy(16)).tokens; });
    }
    for (auto& c : clients) c.join();
  }
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(together[i], alone[i]) << "request " << i;
}

// W4A16 weights, where a matrix multiply's rounding depends on its row count (kernels::
// kTileMinTokens): the scheduler keeps each sequence's rows on the kernels its own forward uses,
// so decode steps batched with a prompt chunk still answer as alone.
TEST(BatchingW4, EachRequestAnswersAsItDoesAlone) {
  EngineOptions eo;
  eo.n_ctx = 512;
  eo.load.precision = quant::Precision::kW4A16;
  std::unique_ptr<Engine> engine;
  try {
    engine = std::make_unique<Engine>(default_model_path(), eo);
  } catch (const std::exception& e) {
    GTEST_SKIP() << e.what();
  }
  std::vector<std::vector<TokenId>> ps;
  for (const char* text : {"The capital of France is", "Water boils at", "My favourite book is"}) {
    ps.push_back(engine->encode(text, false));
  }
  std::string long_text;
  for (int i = 0; i < 12; ++i) long_text += "Line " + std::to_string(i) + ": the orchard's apples ripened early. ";
  ps.push_back(engine->encode(long_text, false));
  GenerateOptions o;
  o.max_tokens = 12;
  o.sampler.temperature = 0;
  o.ignore_eos = true;
  o.top_logprobs = 0;  // the chosen token's log-probability: the logits, finely
  std::vector<GenerateResult> alone, together(ps.size());
  for (const auto& p : ps) alone.push_back(engine->session().generate(p, o));
  {
    Scheduler scheduler(*engine, {.n_sessions = 4, .prefill_chunk = 16});
    std::vector<std::thread> clients;
    for (size_t i = 0; i < ps.size(); ++i) {
      clients.emplace_back([&, i] {
        // the long prompt arrives while the others decode
        if (i + 1 == ps.size()) std::this_thread::sleep_for(std::chrono::milliseconds(150));
        together[i] = scheduler.run(ps[i], o);
      });
    }
    for (auto& c : clients) c.join();
  }
  float worst = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    ASSERT_EQ(together[i].logprobs.size(), alone[i].logprobs.size());
    for (size_t k = 0; k < alone[i].logprobs.size(); ++k) {
      worst = std::max(worst, std::abs(together[i].logprobs[k].chosen.logprob - alone[i].logprobs[k].chosen.logprob));
    }
  }
  EXPECT_EQ(worst, 0.0f) << "batched log-probabilities differ from solo ones by up to " << worst;
}

TEST_F(Batching, CancellingOneLeavesTheOthers) {
  const auto ps = prompts();
  const auto alone = engine_->session().generate(ps[0], greedy(32)).tokens;
  Scheduler scheduler(*engine_, {.n_sessions = 2, .prefill_chunk = 64});
  GenerateResult kept, cancelled;
  std::thread a([&] { kept = scheduler.run(ps[0], greedy(32)); });
  std::thread b([&] {
    auto o = greedy(500);
    size_t seen = 0;
    o.on_token = [&](TokenId, const StepLogprobs*) { return ++seen < 5; };
    cancelled = scheduler.run(ps[1], o);
  });
  a.join();
  b.join();
  EXPECT_EQ(kept.tokens, alone);
  EXPECT_FALSE(kept.cancelled);
  EXPECT_TRUE(cancelled.cancelled);
  EXPECT_LT(cancelled.tokens.size(), 10u);  // stopped within a step or two of the callback
}

TEST_F(Batching, ErrorsReachOnlyTheirCaller) {
  Scheduler scheduler(*engine_, {.n_sessions = 1, .prefill_chunk = 64});
  const std::vector<TokenId> too_long(engine_->n_ctx(), 2);
  EXPECT_THROW(scheduler.run(too_long, greedy(4)), Error);
  EXPECT_THROW(scheduler.run({}, greedy(4)), Error);
  const auto ps = prompts();
  EXPECT_EQ(scheduler.run(ps[0], greedy(8)).tokens.size(), 8u);
}

TEST_F(Batching, PromptCacheAcrossRequests) {
  const auto ps = prompts();
  Scheduler scheduler(*engine_, {.n_sessions = 2, .prefill_chunk = 64});
  auto o = greedy(8);
  o.cache_prompt = true;
  const auto first = scheduler.run(ps.back(), o);
  const auto again = scheduler.run(ps.back(), o);
  EXPECT_EQ(again.cached_tokens, ps.back().size() - kernels::kTileMinTokens);
  EXPECT_EQ(again.tokens, first.tokens);
}

}  // namespace
}  // namespace kestrel::runtime
