// Continuous batching (runtime/scheduler.h) on the default model: requests run together give
// each the answer it gets alone (greedy), a cancelled request stops without disturbing the
// others, more requests than sessions wait their turn, and errors reach only their caller.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "default_engine.h"
#include "kestrel/base/error.h"
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
  EXPECT_EQ(again.cached_tokens, ps.back().size() - 1);
  EXPECT_EQ(again.tokens, first.tokens);
}

}  // namespace
}  // namespace kestrel::runtime
