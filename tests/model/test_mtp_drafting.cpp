// `--draft auto` on a model file that carries a Gemma 4 MTP assistant (docs/speculative.md):
// the engine loads the assistant, generation drafts with it, and the tokens are those of
// decoding without a draft, greedy and sampled (the verification keeps only the model's own
// tokens). The tiny assistants are random, so few drafts are accepted (and drafting backs
// off); what is tested is that drafting happens and changes nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "kestrel/image/hf_gemma4.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/session.h"
#include "test_models.h"
#include "source_dir.h"

namespace kestrel::runtime {
namespace {

namespace fs = std::filesystem;

GenerateOptions options(size_t n, DraftMode draft, float temperature) {
  GenerateOptions o;
  o.max_tokens = n;
  o.sampler.temperature = temperature;
  o.sampler.top_k = 40;
  o.sampler.seed = 99;
  o.ignore_eos = true;
  o.draft = draft;
  return o;
}

TEST(MtpDrafting, AutoDraftsWithTheAssistantAndKeepsTheTokens) {
  for (const std::string name : {"e2b_tiny", "e4b_tiny"}) {
    SCOPED_TRACE(name);
    const fs::path dir = ::kestrel::testing::source_dir() / "tests/data/gemma4" / name;
    const fs::path path = fs::temp_directory_path() / ("kestrel_test_mtp_drafting_" + name + ".gguf");
    image::write_hf_gemma4_gguf(dir / "hf", path, {}, dir / "assistant");
    EngineOptions o;
    o.n_ctx = 256;
    o.n_threads = 2;
    Engine e(path, o);
    ASSERT_NE(e.mtp_assistant(), nullptr);
    // Past the sliding window of 8, so the assistant's W + 1 positions come from the ring.
    const auto prompt = model::random_tokens(20, e.model().info().n_vocab, 3);
    for (const float temperature : {0.0f, 1.0f}) {
      Session plain(e), drafted(e), ngram(e);
      const auto a = plain.generate(prompt, options(40, DraftMode::kNone, temperature));
      const auto b = drafted.generate(prompt, options(40, DraftMode::kAuto, temperature));
      EXPECT_EQ(a.tokens, b.tokens) << "temperature " << temperature;
      EXPECT_EQ(a.text, b.text);
      EXPECT_GT(b.drafted_tokens, 0u);
      EXPECT_LE(b.accepted_tokens, b.drafted_tokens);
      std::cout << name << " temperature " << temperature << ": " << b.drafted_tokens << " drafted, "
                << b.accepted_tokens << " accepted\n";
      EXPECT_EQ(drafted.cached_tokens().size(), plain.cached_tokens().size());
      const auto c = ngram.generate(prompt, options(40, DraftMode::kNgram, temperature));
      EXPECT_EQ(c.tokens, a.tokens);
    }
    // A model file without an assistant has none.
    Engine plain_engine(model::tiny_gemma4(name.c_str()), o);
    EXPECT_EQ(plain_engine.mtp_assistant(), nullptr);
    fs::remove(path);
  }
}

}  // namespace
}  // namespace kestrel::runtime
