// Gemma 4's MTP assistant (model/mtp_assistant.h) against HF transformers: tiny random
// assistants for the tiny Gemma 4 targets (tests/data/gemma4/*/assistant, written with their
// references by scripts/goldens/make_tiny_gemma4_assistant.py). transformers'
// SinglePositionMultiTokenCandidateGenerator drafted 4 tokens after the target's prefill of
// each of the 8 golden prompts; Kestrel must give the same logits and the same greedy drafts
//   1. from transformers' own inputs (its target hidden state and K/V, loaded into a Kestrel
//      cache as fp16): the assistant's forward alone;
//   2. from Kestrel's own target (its prefill, hidden state, fp16 cache): end to end;
//   3. from a bf16 image built with `--assistant`.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/head/output_head.h"
#include "kestrel/image/builder.h"
#include "kestrel/image/hf_gemma3.h"
#include "kestrel/image/hf_gemma4.h"
#include "kestrel/image/hf_gemma4_assistant.h"
#include "kestrel/kernels/ops.h"
#include "kestrel/model/gemma_decoder.h"
#include "kestrel/model/model.h"
#include "kestrel/model/mtp_assistant.h"
#include "source_dir.h"

namespace kestrel::model {
namespace {

namespace fs = std::filesystem;

// The tiny assistants' logits reach 10.4 (e2b) and 14.5 (e4b); top-2 margins of their drafts
// are >= 0.008.
// 1. transformers' inputs: only the fp16 rounding of K and V (HF: float32) differs; measured
//    max |dlogit| 0.0033 (e2b_tiny) and 0.0047 (e4b_tiny).
constexpr float kOwnInputsTolerance = 1e-2f;
// 2. Kestrel's target: its hidden state and fp16 cache differ from HF's as
//    tests/model/test_gemma4.cpp bounds (target logits within 0.03); measured 0.0041 / 0.0056.
constexpr float kEndToEndTolerance = 3e-2f;

struct Case {
  std::vector<TokenId> prompt;
  TokenId bonus = 0;
  size_t position = 0;
  std::vector<TokenId> drafts;
  std::vector<float> margins, centroid_margins;
  std::vector<float> logits;  // [n_draft, n_vocab]
  std::vector<float> hidden;  // [d_target]
  std::vector<float> kf, vf, ks, vs;  // [n, width] each
};

struct Goldens {
  size_t n_vocab = 0, n_draft = 0, d_target = 0, full_layer = 0, sliding_layer = 0, full_width = 0, sliding_width = 0;
  bool ordered = false;
  std::vector<Case> cases;
};

fs::path data_dir(const std::string& name) { return ::kestrel::testing::source_dir() / "tests/data/gemma4" / name; }

Goldens read_goldens(const std::string& name) {
  const fs::path dir = ::kestrel::testing::source_dir() / "tests/goldens";
  std::ifstream in(dir / ("gemma4_" + name + "_assistant.json"));
  const nlohmann::json j = nlohmann::json::parse(in);
  Goldens g;
  g.n_vocab = j.at("n_vocab").get<size_t>();
  g.n_draft = j.at("n_draft").get<size_t>();
  g.d_target = j.at("d_target").get<size_t>();
  g.full_layer = j.at("full_kv_layer").get<size_t>();
  g.sliding_layer = j.at("sliding_kv_layer").get<size_t>();
  g.full_width = j.at("full_kv_width").get<size_t>();
  g.sliding_width = j.at("sliding_kv_width").get<size_t>();
  g.ordered = j.at("use_ordered_embeddings").get<bool>();
  std::ifstream bin(dir / j.at("bin").get<std::string>(), std::ios::binary);
  bin.seekg(0, std::ios::end);
  std::vector<float> all(static_cast<size_t>(bin.tellg()) / sizeof(float));
  bin.seekg(0);
  bin.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(all.size() * sizeof(float)));
  for (const auto& c : j.at("cases")) {
    Case k;
    k.prompt = c.at("prompt").get<std::vector<TokenId>>();
    k.bonus = c.at("bonus").get<TokenId>();
    k.position = c.at("position").get<size_t>();
    k.drafts = c.at("drafts").get<std::vector<TokenId>>();
    k.margins = c.at("top2_margins").get<std::vector<float>>();
    k.centroid_margins = c.at("centroid_margins").get<std::vector<float>>();
    size_t at = c.at("offset").get<size_t>();
    auto take = [&](size_t n) {
      EXPECT_LE(at + n, all.size()) << "goldens .bin too short";
      std::vector<float> v(all.begin() + static_cast<std::ptrdiff_t>(at), all.begin() + static_cast<std::ptrdiff_t>(at + n));
      at += n;
      return v;
    };
    const size_t n = k.prompt.size();
    k.logits = take(g.n_draft * g.n_vocab);
    k.hidden = take(g.d_target);
    k.kf = take(n * g.full_width);
    k.vf = take(n * g.full_width);
    k.ks = take(n * g.sliding_width);
    k.vs = take(n * g.sliding_width);
    g.cases.push_back(std::move(k));
  }
  return g;
}

/// The target GGUF with the assistant, written from the two HF directories.
// A file of its own per test and process: ctest runs this suite's tests in parallel processes,
// and one test's remove() must not pull the file from under another's load.
fs::path converted(const std::string& name) {
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string tag = test != nullptr ? std::string(test->name()) : "none";
  std::replace_if(tag.begin(), tag.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  const fs::path out = fs::temp_directory_path() /
                       ("kestrel_test_mtp_" + name + "_" + tag + "_" + std::to_string(::getpid()) + ".gguf");
  image::write_hf_gemma4_gguf(data_dir(name) / "hf", out, {}, data_dir(name) / "assistant");
  return out;
}

const GemmaDecoder& decoder(const Model& m) {
  const auto* d = dynamic_cast<const GemmaDecoder*>(&m);
  if (d == nullptr) throw Error("not a GemmaDecoder");
  return *d;
}

/// Puts transformers' K/V rows (float32 [n, width]) into a cache layer, as fp16.
void fill(LayerCache& lc, const std::vector<float>& k, const std::vector<float>& v, size_t n) {
  ASSERT_EQ(k.size(), n * lc.stride);
  for (size_t pos = 0; pos < n; ++pos) {
    const size_t slot = pos % lc.capacity;
    lc.k.write(slot, &k[pos * lc.stride]);
    lc.v.write(slot, &v[pos * lc.stride]);
  }
}

struct Result {
  float worst = 0.0f;  // max |logit - HF| over the steps compared (scored tokens only, see compare)
  size_t drafts_same = 0, drafts = 0;
  size_t steps_compared = 0;
  size_t same_clusters = 0;  // steps whose centroid-masked head scored the same tokens as HF's
};

/// Compares `logits` [n_draft, n_vocab] with the case's, step by step while the drafts agree
/// (a later step's input is the earlier step's draft). With the centroid-masked head, a token
/// outside the chosen clusters holds the row's minimum (min of the scored ones - 1): the
/// difference is taken over the tokens both sides scored, and a step counts in same_clusters
/// when both scored the same tokens (then every logit is compared, the masked value included).
void compare(const Goldens& g, const Case& k, const std::vector<TokenId>& drafts, const std::vector<float>& logits,
             Result& r) {
  for (size_t s = 0; s < g.n_draft; ++s) {
    const float* got = &logits[s * g.n_vocab];
    const float* want = &k.logits[s * g.n_vocab];
    const float got_min = *std::min_element(got, got + g.n_vocab);
    const float want_min = *std::min_element(want, want + g.n_vocab);
    bool same = true;
    for (size_t v = 0; v < g.n_vocab; ++v) {
      const bool got_masked = g.ordered && got[v] == got_min;
      const bool want_masked = g.ordered && want[v] == want_min;
      same = same && got_masked == want_masked;
      if (got_masked != want_masked) continue;
      r.worst = std::max(r.worst, std::fabs(got[v] - want[v]));
    }
    r.same_clusters += same;
    ++r.steps_compared;
    if (drafts[s] != k.drafts[s]) break;
  }
  for (size_t s = 0; s < g.n_draft; ++s) r.drafts_same += drafts[s] == k.drafts[s];
  r.drafts += g.n_draft;
}

class Gemma4Assistant : public ::testing::TestWithParam<std::string> {};

TEST_P(Gemma4Assistant, LogitsAndDraftsMatchTransformersFromItsInputs) {
  const Goldens g = read_goldens(GetParam());
  const fs::path path = converted(GetParam());
  const gguf::File file = gguf::File::open(path);
  ThreadPool pool(2);
  const auto model = load_model(file, LoadOptions{}, pool);
  const GemmaDecoder& target = decoder(*model);
  ASSERT_TRUE(MtpAssistant::in_file(file));
  const MtpAssistant assistant(file, target, LoadOptions{}, pool);
  EXPECT_EQ(assistant.config().n_layers, 4u);
  EXPECT_EQ(assistant.config().n_centroids > 0, g.ordered);
  Result r;
  for (const Case& k : g.cases) {
    KvCache cache = target.new_cache(64);
    fill(cache.layers[g.full_layer], k.kf, k.vf, k.prompt.size());
    fill(cache.layers[g.sliding_layer], k.ks, k.vs, k.prompt.size());
    cache.append(k.prompt);
    std::vector<float> logits;
    const auto drafts = assistant.draft(k.bonus, k.hidden.data(), cache, g.n_draft, pool, &logits);
    EXPECT_EQ(drafts, k.drafts) << "prompt of " << k.prompt.size() << " tokens";
    compare(g, k, drafts, logits, r);
  }
  std::cout << GetParam() << " assistant on transformers' inputs: max |logit - HF| = " << r.worst << " over "
            << r.steps_compared << " steps, drafts " << r.drafts_same << "/" << r.drafts << "\n";
  EXPECT_LE(r.worst, kOwnInputsTolerance);
  EXPECT_EQ(r.same_clusters, r.steps_compared);
  EXPECT_EQ(r.drafts_same, r.drafts);
  fs::remove(path);
}

/// Kestrel's target runs the prompt; its greedy token, hidden state and cache feed the assistant.
Result end_to_end(const Goldens& g, const Model& model, const MtpAssistant& assistant, ThreadPool& pool,
                  size_t* bonus_same) {
  const GemmaDecoder& target = decoder(model);
  Result r;
  for (const Case& k : g.cases) {
    KvCache cache = target.new_cache(64);
    std::vector<float> hidden(g.d_target), logits(g.n_vocab);
    target.forward_hidden(k.prompt, cache, Logits::kLast, hidden.data(), pool);
    head::dense_logits(target.output_head(), hidden.data(), 1, logits.data(), pool);
    const auto bonus = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    *bonus_same += bonus == k.bonus;
    std::vector<float> draft_logits;
    const auto drafts = assistant.draft(k.bonus, hidden.data(), cache, g.n_draft, pool, &draft_logits);
    compare(g, k, drafts, draft_logits, r);
  }
  return r;
}

TEST_P(Gemma4Assistant, DraftsFromKestrelsTargetMatchTransformers) {
  const Goldens g = read_goldens(GetParam());
  const fs::path path = converted(GetParam());
  const gguf::File file = gguf::File::open(path);
  ThreadPool pool(2);
  const auto model = load_model(file, LoadOptions{}, pool);
  const MtpAssistant assistant(file, decoder(*model), LoadOptions{}, pool);
  size_t bonus_same = 0;
  const Result r = end_to_end(g, *model, assistant, pool, &bonus_same);
  std::cout << GetParam() << " assistant end to end: max |logit - HF| = " << r.worst << " over " << r.steps_compared
            << " steps, drafts " << r.drafts_same << "/" << r.drafts << "\n";
  EXPECT_EQ(bonus_same, g.cases.size());
  EXPECT_LE(r.worst, kEndToEndTolerance);
  EXPECT_EQ(r.same_clusters, r.steps_compared);
  EXPECT_EQ(r.drafts_same, r.drafts);
  fs::remove(path);
}

// `kestrel build TARGET --assistant DIR` as a bf16 image: the assistant's matrices are stored
// as the embedding is (BF16), its vectors and token ordering as F32, its configuration as
// gemma4_assistant.* metadata; it loads from the image and drafts close to transformers (bf16
// weights of both models: most drafts equal).
TEST_P(Gemma4Assistant, Bf16ImageCarriesTheAssistant) {
  const Goldens g = read_goldens(GetParam());
  const fs::path out = fs::temp_directory_path() / ("kestrel_test_mtp_" + GetParam() + ".bf16.kimg");
  image::BuildOptions options;
  options.precision = quant::Precision::kBF16;
  options.assistant = data_dir(GetParam()) / "assistant";
  ThreadPool pool(2);
  image::build_image_from_hf(data_dir(GetParam()) / "hf", out, options, pool);
  const gguf::File file = gguf::File::open(out);
  ASSERT_TRUE(MtpAssistant::in_file(file));
  const auto* q = file.find_tensor("mtp.blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, gguf::TensorType::kBF16);
  const auto* order = file.find_tensor("mtp.token_ordering.weight");
  EXPECT_EQ(order != nullptr, g.ordered);
  if (order != nullptr) {
    EXPECT_EQ(order->type, gguf::TensorType::kF32);
  }
  EXPECT_EQ(file.get_uint(image::mtp_keys::kBackboneLength), g.d_target);
  const auto model = load_model(file, LoadOptions{}, pool);
  const MtpAssistant assistant(file, decoder(*model), LoadOptions{}, pool);
  size_t bonus_same = 0;
  const Result r = end_to_end(g, *model, assistant, pool, &bonus_same);
  std::cout << GetParam() << " assistant in a bf16 image: max |logit - HF| = " << r.worst << " (scored tokens), drafts "
            << r.drafts_same << "/" << r.drafts << ", same clusters " << r.same_clusters << "/" << r.steps_compared
            << ", target's next token " << bonus_same << "/" << g.cases.size() << "\n";
  EXPECT_LE(r.worst, 1.0f);
  EXPECT_GE(static_cast<double>(r.drafts_same), 0.75 * static_cast<double>(r.drafts));

  // A FlashHead image stores the target's embedding in cluster order; the assistant reads the
  // target's input rows through the head's token -> row map, so its drafts and logits are
  // those of the plain bf16 image exactly.
  const fs::path fh = fs::temp_directory_path() / ("kestrel_test_mtp_" + GetParam() + ".fh.kimg");
  options.flashhead = true;
  image::build_image_from_hf(data_dir(GetParam()) / "hf", fh, options, pool);
  const gguf::File fh_file = gguf::File::open(fh);
  const auto fh_model = load_model(fh_file, LoadOptions{}, pool);
  ASSERT_FALSE(fh_model->output_head().row_tokens.empty());
  const MtpAssistant fh_assistant(fh_file, decoder(*fh_model), LoadOptions{}, pool);
  for (const Case& k : g.cases) {
    std::vector<float> logits[2];
    std::vector<TokenId> drafts[2];
    for (int variant : {0, 1}) {
      const Model& m = variant == 0 ? *model : *fh_model;
      KvCache cache = decoder(m).new_cache(64);
      std::vector<float> hidden(g.d_target);
      m.forward_hidden(k.prompt, cache, Logits::kLast, hidden.data(), pool);
      drafts[variant] = (variant == 0 ? assistant : fh_assistant).draft(k.bonus, hidden.data(), cache, g.n_draft, pool,
                                                                        &logits[variant]);
    }
    EXPECT_EQ(drafts[1], drafts[0]);
    EXPECT_EQ(logits[1], logits[0]);
  }
  fs::remove(out);
  fs::remove(fh);
}

INSTANTIATE_TEST_SUITE_P(Models, Gemma4Assistant, ::testing::Values("e2b_tiny", "e4b_tiny"));

TEST(Gemma4AssistantErrors, MismatchesAndMisuseAreErrors) {
  // The e2b assistant reads 1 KV head; the e4b target has 2.
  const fs::path out = fs::temp_directory_path() / "kestrel_test_mtp_mismatch.gguf";
  try {
    image::write_hf_gemma4_gguf(data_dir("e4b_tiny") / "hf", out, {}, data_dir("e2b_tiny") / "assistant");
    ADD_FAILURE() << "a mismatched assistant was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K/V"), std::string::npos) << e.what();
  }
  // Not an assistant directory.
  EXPECT_THROW(image::write_hf_gemma4_gguf(data_dir("e4b_tiny") / "hf", out, {}, data_dir("e2b_tiny") / "hf"), Error);
  // --assistant with a GGUF source.
  image::BuildOptions options;
  options.precision = quant::Precision::kBF16;
  options.assistant = data_dir("e4b_tiny") / "assistant";
  ThreadPool pool(2);
  EXPECT_THROW(image::build_image(data_dir("e4b_tiny") / "model.gguf", out, options, pool), Error);
  EXPECT_FALSE(fs::exists(out));
  // A model without an assistant; an empty cache.
  const gguf::File plain = gguf::File::open(data_dir("e4b_tiny") / "model.gguf");
  const auto model = load_model(plain, LoadOptions{}, pool);
  EXPECT_FALSE(MtpAssistant::in_file(plain));
  EXPECT_THROW(MtpAssistant(plain, decoder(*model), LoadOptions{}, pool), Error);
  const fs::path path = converted("e4b_tiny");
  const gguf::File file = gguf::File::open(path);
  const auto model2 = load_model(file, LoadOptions{}, pool);
  const MtpAssistant assistant(file, decoder(*model2), LoadOptions{}, pool);
  KvCache empty = decoder(*model2).new_cache(16);
  std::vector<float> hidden(64), logits(512);
  EXPECT_THROW(assistant.step(5, hidden.data(), empty, logits.data(), hidden.data(), pool), Error);
  KvCache one = decoder(*model2).new_cache(16);
  const TokenId two[] = {2, 7};
  model2->forward_hidden(two, one, Logits::kLast, hidden.data(), pool);
  EXPECT_THROW(assistant.step(512, hidden.data(), one, logits.data(), hidden.data(), pool), Error);
  EXPECT_NO_THROW(assistant.step(5, hidden.data(), one, logits.data(), hidden.data(), pool));
  fs::remove(path);
}

}  // namespace
}  // namespace kestrel::model
