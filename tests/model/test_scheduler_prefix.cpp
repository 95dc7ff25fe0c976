// Many conversations on the continuous-batching scheduler with the shared prefix cache
// (runtime/scheduler.h, runtime/prefix_cache.h), on the default model's W4A16 weights with the
// int8 kernels (its image's path): a crowd sharing one system prompt prefills it once and every
// answer equals the conversation's solo cold answer (isolation: near-identical prompts never
// receive one another's KV); conversations beyond the sessions get warm follow-ups; the model's
// batching policy puts every decode row in one pass and answers do not change.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kestrel/model/model.h"
#include "kestrel/runtime/model_path.h"
#include "kestrel/runtime/scheduler.h"

namespace kestrel::runtime {
namespace {

class SharedPrefix : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    try {
      EngineOptions eo;
      eo.n_ctx = 2048;
      eo.load.precision = quant::Precision::kW4A16;
      eo.load.decode_activations = kernels::DecodeActivations::kInt8;
      engine_ = std::make_unique<Engine>(default_model_path(), eo);
    } catch (const std::exception& e) {
      skip_ = e.what();
    }
  }
  static void TearDownTestSuite() { engine_.reset(); }
  void SetUp() override {
    if (!engine_) GTEST_SKIP() << skip_;
  }
  static GenerateOptions greedy(size_t n) {
    GenerateOptions o;
    o.max_tokens = n;
    o.sampler.temperature = 0;
    o.ignore_eos = true;
    o.cache_prompt = true;
    return o;
  }
  // A tool-list-like system prompt of ~500 tokens.
  static std::string system_prompt() {
    std::string s = "You are an agent with these tools.\n";
    for (int i = 0; i < 16; ++i) {
      s += "Tool " + std::to_string(i) + ": get_record_" + std::to_string(i) +
           "(id: string, fields: list of strings) returns the record's fields as JSON.\n";
    }
    return s;
  }
  // The answer a prompt gets alone from an empty cache (the scheduler's sessions include the
  // engine's own, so this runs before a Scheduler exists).
  static std::vector<TokenId> cold(const std::vector<TokenId>& prompt, size_t n) {
    auto o = greedy(n);
    o.cache_prompt = false;
    return engine_->session().generate(prompt, o).tokens;
  }
  static inline std::unique_ptr<Engine> engine_;
  static inline std::string skip_;
};

TEST_F(SharedPrefix, TheInt8KernelsBatchAnyRows) {
  EXPECT_EQ(engine_->model().batch_exactness(), model::BatchExactness::kAnyRows);
}

// 8 agents with one system prompt and near-identical questions, on 8 sessions and on 3.
TEST_F(SharedPrefix, ACrowdPrefillsItsSystemPromptOnceAndEachAnswersAsAlone) {
  const std::string sys = system_prompt();
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(engine_->encode(sys + "User: what does tool " + std::to_string(i % 4) + " return for id " +
                                          std::to_string(100 + i) + "?\nAgent:",
                                      false));
  }
  const size_t sys_tokens = engine_->encode(sys, false).size();
  ASSERT_GT(sys_tokens, 400u);
  std::vector<std::vector<TokenId>> alone;
  for (const auto& p : prompts) alone.push_back(cold(p, 8));
  for (size_t sessions : {8u, 3u}) {
    SCOPED_TRACE("sessions " + std::to_string(sessions));
    std::vector<GenerateResult> got(prompts.size());
    Scheduler scheduler(*engine_, {.n_sessions = sessions, .prefill_chunk = 64, .cache_ram = size_t{256} << 20});
    std::vector<std::thread> clients;
    for (size_t i = 0; i < prompts.size(); ++i) {
      clients.emplace_back([&, i] { got[i] = scheduler.run(prompts[i], greedy(8)); });
    }
    for (auto& c : clients) c.join();
    size_t warm = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i].tokens, alone[i]) << "request " << i;
      // A request that arrives when all but the last blocks of the prompt are cached copies
      // those and prefills the rest itself rather than wait (runtime/scheduler.cpp).
      if (got[i].cached_tokens + 2 * scheduler.prefix_block_tokens() >= sys_tokens) ++warm;
    }
    // Only the first prefilled the system prompt; every other copied it, from the shared cache
    // or from its session's own last prompt.
    EXPECT_GE(warm, prompts.size() - 1);
    EXPECT_GT(scheduler.prefix_cache_stats()->hits.load(), 0u);
  }
}

// 8 conversations taking two turns in a random order on 2 sessions: every follow-up finds its
// first turn in the prefix cache though its session served others meanwhile.
TEST_F(SharedPrefix, ConversationsBeyondTheSessionsGetWarmFollowUps) {
  constexpr size_t kConversations = 8;
  std::vector<std::vector<TokenId>> turn1;
  for (size_t c = 0; c < kConversations; ++c) {
    std::string text = "Conversation " + std::to_string(c) + ". ";
    for (int i = 0; i < 12; ++i) text += "Fact " + std::to_string(i) + " about city " + std::to_string(c) + " is noted. ";
    turn1.push_back(engine_->encode(text + "Question: summarize.\nAnswer:", false));
  }
  Scheduler scheduler(*engine_, {.n_sessions = 2, .prefill_chunk = 64, .cache_ram = size_t{256} << 20});
  std::vector<std::vector<TokenId>> turn2(kConversations);
  for (size_t c = 0; c < kConversations; ++c) {
    const auto first = scheduler.run(turn1[c], greedy(16));
    turn2[c] = turn1[c];
    turn2[c].insert(turn2[c].end(), first.tokens.begin(), first.tokens.end());
    const auto more = engine_->encode("\nQuestion: and the population?\nAnswer:", false);
    turn2[c].insert(turn2[c].end(), more.begin() + 1, more.end());  // without its BOS
  }
  std::vector<size_t> order(kConversations);
  for (size_t c = 0; c < kConversations; ++c) order[c] = c;
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  std::vector<GenerateResult> got(kConversations);
  for (size_t c : order) got[c] = scheduler.run(turn2[c], greedy(8));
  for (size_t c = 0; c < kConversations; ++c) {
    SCOPED_TRACE("conversation " + std::to_string(c));
    const size_t block = scheduler.prefix_block_tokens();
    // Its first turn's prompt, in whole blocks (the answer's tokens were decoded, not prefilled:
    // their bits differ from a prefill's, so they are prefilled again, model/kv_cache.h).
    EXPECT_GE(got[c].cached_tokens, turn1[c].size() / block * block);
  }
  // Their answers equal cold runs (the scheduler is gone: the engine's session is free again).
  std::vector<std::vector<TokenId>> want;
  for (size_t c = 0; c < kConversations; ++c) want.push_back(got[c].tokens);
  for (size_t c = 0; c < kConversations; ++c) EXPECT_EQ(want[c], cold(turn2[c], 8)) << "conversation " << c;
}

// Without the prefix cache (cache_ram 0) nothing is shared between sessions, as before.
TEST_F(SharedPrefix, OffMeansEachSessionAlone) {
  const auto p = engine_->encode(system_prompt() + "User: hello\nAgent:", false);
  Scheduler scheduler(*engine_, {.n_sessions = 2, .prefill_chunk = 64});
  EXPECT_EQ(scheduler.prefix_cache_stats(), nullptr);
  const auto a = scheduler.run(p, greedy(4));
  // The session may reuse its own last prompt's start (a BOS token), never another's prefix.
  EXPECT_LE(a.cached_tokens, 1u);
}

}  // namespace
}  // namespace kestrel::runtime
