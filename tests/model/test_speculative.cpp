// Speculative decoding with the n-gram drafter (runtime/drafter.h) and a draft model
// (runtime/draft_model.h): with the exact acceptance rule the tokens are exactly those of
// decoding without a draft — greedy on the llama.cpp parity prompts, sampled with a seed, on a
// copy-heavy prompt where most drafts are accepted, and on the tiny Gemma 4 models — and the
// drafter really drafted (so that the comparisons are not vacuous). Draft models: the default
// model drafting for itself, a tiny random Gemma 3 with the default model's vocabulary, the tiny
// E2B-like Gemma 4 drafting for the tiny E4B-like one. With speculative sampling
// (DraftAccept::kDistribution) the sampled tokens' frequencies over many seeds match decoding
// without a draft (two-sample chi-square per position).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "default_engine.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/formats/gguf_writer.h"
#include "kestrel/runtime/session.h"
#include "test_models.h"
#include "source_dir.h"

namespace kestrel::runtime {
namespace {

namespace fs = std::filesystem;

GenerateOptions options(size_t n, DraftMode draft, float temperature = 0.0f) {
  GenerateOptions o;
  o.max_tokens = n;
  o.sampler.temperature = temperature;
  o.sampler.top_k = 40;
  o.sampler.seed = 1234;
  o.ignore_eos = true;
  o.draft = draft;
  return o;
}

// Generates `prompt` without and with drafting; the tokens must be equal. Returns the drafted run.
GenerateResult same_tokens(Engine& e, const std::vector<TokenId>& prompt, size_t n, float temperature,
                           DraftMode mode = DraftMode::kNgram) {
  Session plain(e), drafted(e);
  const auto a = plain.generate(prompt, options(n, DraftMode::kNone, temperature));
  const auto b = drafted.generate(prompt, options(n, mode, temperature));
  EXPECT_EQ(a.tokens, b.tokens) << "temperature " << temperature;
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.drafted_tokens, 0u);
  EXPECT_LE(b.accepted_tokens, b.drafted_tokens);
  // The cache holds what it would without drafting: the prompt and every token but the last.
  EXPECT_EQ(drafted.cached_tokens().size(), plain.cached_tokens().size());
  return b;
}

// The GGUF's auto form (what `kestrel run -m GGUF` loads): drafting must not change tokens on
// any path, and this one runs the int8 / INT4 kernels several times faster than the float32
// parity path (CI time); VerifyRows covers every precision row for row.
class Speculative : public WithDefaultEngine<1024, quant::Precision::kAuto> {};

TEST_F(Speculative, ParityPromptsGiveTheSameTokens) {
  std::ifstream in(::kestrel::testing::source_dir() / "tests/goldens/model_llamacpp.json");
  const auto goldens = nlohmann::json::parse(in);
  size_t drafted = 0;
  const auto& refs = goldens["references"]["q4_k_m"];
  for (size_t i = 0; i < refs.size(); i += 2) {  // half the prompts greedy, a sixth sampled too (CI time)
    const auto prompt = refs[i]["tokens"].get<std::vector<TokenId>>();
    drafted += same_tokens(*engine_, prompt, 32, 0.0f).drafted_tokens;
    if (i % 6 == 0) drafted += same_tokens(*engine_, prompt, 32, 0.9f).drafted_tokens;
  }
  EXPECT_GT(drafted, 0u);
}

TEST_F(Speculative, CopyHeavyTextAcceptsMostDrafts) {
  const std::string code =
      "def moving_average(values, window):\n"
      "    out = []\n"
      "    total = 0.0\n"
      "    for i, v in enumerate(values):\n"
      "        total += v\n"
      "        if i >= window:\n"
      "            total -= values[i - window]\n"
      "        if i >= window - 1:\n"
      "            out.append(total / window)\n"
      "    return out\n";
  const auto prompt = engine_->encode("In utils.py:\n\n" + code + "\nThe same function in stats.py:\n\n" + code +
                                          "\nAnd again in metrics.py:\n\ndef moving_average(",
                                      false);
  const auto r = same_tokens(*engine_, prompt, 64, 0.0f);
  EXPECT_GT(r.drafted_tokens, 32u);
  EXPECT_GT(r.accepted_tokens * 2, r.drafted_tokens) << r.accepted_tokens << " of " << r.drafted_tokens;
  same_tokens(*engine_, prompt, 64, 0.7f);
}

TEST(SpeculativeGemma4, TinyModelsGiveTheSameTokens) {
  for (const char* name : {"e2b_tiny", "e4b_tiny"}) {
    SCOPED_TRACE(name);
    EngineOptions o;
    o.n_ctx = 256;
    o.n_threads = 2;
    Engine e(model::tiny_gemma4(name), o);
    // A repeated random phrase (window 8: the draft and its rollback cross the sliding ring).
    auto prompt = model::random_tokens(12, e.model().info().n_vocab, 5);
    for (int i = 0; i < 3; ++i) prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + 12);
    const auto r = same_tokens(e, prompt, 40, 0.0f);
    EXPECT_GT(r.drafted_tokens, 0u);
    same_tokens(e, prompt, 40, 1.0f);
  }
}

// ---- Draft models ----

std::vector<std::vector<TokenId>> parity_prompts() {
  std::ifstream in(::kestrel::testing::source_dir() / "tests/goldens/model_llamacpp.json");
  const auto goldens = nlohmann::json::parse(in);
  std::vector<std::vector<TokenId>> out;
  for (const auto& r : goldens["references"]["q4_k_m"]) out.push_back(r["tokens"].get<std::vector<TokenId>>());
  return out;
}

// A tiny random Gemma 3 (2 layers, d_model 64) with the default model's vocabulary and
// tokenizer: a draft model whose drafts almost never hit (float32, ~64 MiB).
fs::path write_tiny_gemma3_with_vocabulary_of(const fs::path& source, const fs::path& out) {
  const gguf::File src = gguf::File::open(source);
  const uint32_t d = 64, ff = 128, heads = 2, head_dim = 32, layers = 2;
  const std::map<std::string, uint32_t> dims = {
      {"gemma3.block_count", layers},          {"gemma3.embedding_length", d},
      {"gemma3.feed_forward_length", ff},      {"gemma3.attention.head_count", heads},
      {"gemma3.attention.head_count_kv", 1},   {"gemma3.attention.key_length", head_dim},
      {"gemma3.attention.value_length", head_dim}};
  gguf::Writer w(out, 32);
  for (const auto& [key, value] : src.metadata()) {
    if (key == "general.alignment" || key == "general.file_type" || dims.count(key)) continue;
    w.add(key, value);
  }
  for (const auto& [key, v] : dims) w.add_uint32(key, v);
  const uint64_t n_vocab = src.tensor("token_embd.weight").shape[1];
  struct T {
    std::string name;
    std::vector<uint64_t> shape;
    float mean, sd;
  };
  std::vector<T> tensors = {{"token_embd.weight", {d, n_vocab}, 0.0f, 0.5f}, {"output_norm.weight", {d}, 1.0f, 0.1f}};
  for (uint32_t l = 0; l < layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    for (const char* norm : {"attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"}) {
      tensors.push_back({b + norm + ".weight", {d}, 1.0f, 0.1f});
    }
    tensors.push_back({b + "attn_q_norm.weight", {head_dim}, 1.0f, 0.1f});
    tensors.push_back({b + "attn_k_norm.weight", {head_dim}, 1.0f, 0.1f});
    tensors.push_back({b + "attn_q.weight", {d, heads * head_dim}, 0.0f, 0.1f});
    tensors.push_back({b + "attn_k.weight", {d, head_dim}, 0.0f, 0.1f});
    tensors.push_back({b + "attn_v.weight", {d, head_dim}, 0.0f, 0.1f});
    tensors.push_back({b + "attn_output.weight", {heads * head_dim, d}, 0.0f, 0.1f});
    tensors.push_back({b + "ffn_gate.weight", {d, ff}, 0.0f, 0.1f});
    tensors.push_back({b + "ffn_up.weight", {d, ff}, 0.0f, 0.1f});
    tensors.push_back({b + "ffn_down.weight", {ff, d}, 0.0f, 0.1f});
  }
  for (const auto& t : tensors) w.add_tensor(t.name, gguf::TensorType::kF32, t.shape);
  w.begin_data();
  std::mt19937_64 rng(7);
  for (const auto& t : tensors) {
    std::normal_distribution<float> dist(t.mean, t.sd);
    uint64_t n = 1;
    for (uint64_t x : t.shape) n *= x;
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    w.write(std::as_bytes(std::span<const float>(v)));
  }
  w.finish();
  return out;
}

// The default model with a draft model: itself, or the tiny random Gemma 3 with its vocabulary.
class DraftModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    try {
      EngineOptions o;
      o.n_ctx = 1024;
      // The auto form as Speculative's fixture, with bf16 activations: a draft model's catch-up
      // prefill must round as the target's decode steps do for "always right" below (int8
      // prefill tiles and decode rows differ in their rounding: docs/speculative.md).
      o.load.precision = quant::Precision::kAuto;
      o.load.decode_activations = kernels::DecodeActivations::kBf16;
      self_ = std::make_unique<Engine>(default_model_path(), o);
      self_->load_draft_model(default_model_path(), o);
      tiny_path_ = fs::temp_directory_path() / ("kestrel_tiny_draft_" + std::to_string(::getpid()) + ".gguf");
      write_tiny_gemma3_with_vocabulary_of(default_model_path(), tiny_path_);
      random_ = std::make_unique<Engine>(default_model_path(), o);
      random_->load_draft_model(tiny_path_, o);
    } catch (const std::exception& e) {
      skip_reason_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    self_.reset();
    random_.reset();
    std::error_code ec;
    fs::remove(tiny_path_, ec);
  }
  void SetUp() override {
    if (!self_ || !random_) GTEST_SKIP() << skip_reason_;
  }
  static inline std::unique_ptr<Engine> self_, random_;
  static inline fs::path tiny_path_;
  static inline std::string skip_reason_;
};

TEST_F(DraftModel, ItselfAsDraftGivesTheSameTokensAndIsAlwaysRight) {
  const auto prompts = parity_prompts();
  size_t drafted = 0, accepted = 0;
  for (size_t i = 0; i < prompts.size(); i += 4) {  // a quarter of the prompts (CI time)
    const auto r = same_tokens(*self_, prompts[i], 24, 0.0f, DraftMode::kModel);
    drafted += r.drafted_tokens, accepted += r.accepted_tokens;
    if (i % 8 == 0) same_tokens(*self_, prompts[i], 16, 0.9f, DraftMode::kModel);
  }
  EXPECT_GT(drafted, 50u);
  // Greedy drafts of the same model, computed as decode steps are: every one is the model's own.
  EXPECT_EQ(accepted, drafted);
}

TEST_F(DraftModel, ARandomDraftModelGivesTheSameTokensAndBacksOff) {
  const auto prompts = parity_prompts();
  size_t drafted = 0, accepted = 0, generated = 0;
  for (size_t i = 2; i < prompts.size(); i += 4) {
    const auto r = same_tokens(*random_, prompts[i], 40, 0.0f, DraftMode::kModel);
    drafted += r.drafted_tokens, accepted += r.accepted_tokens, generated += r.tokens.size();
  }
  EXPECT_GT(drafted, 0u);
  // Drafts that miss pause drafting for longer and longer: few tokens drafted per token made.
  EXPECT_LT(drafted * 4, generated) << accepted << " of " << drafted << " accepted";
}

TEST_F(DraftModel, AnotherVocabularyIsRefused) {
  EngineOptions o;
  o.n_ctx = 256;
  Engine e(default_model_path(), o);
  EXPECT_THROW(e.load_draft_model(model::tiny_gemma4("e2b_tiny"), o), VocabularyMismatch);
  EXPECT_EQ(e.draft_model(), nullptr);
  EXPECT_THROW(e.load_draft_model("/nonexistent/draft.kimg", o), Error);
  Session s(e);
  EXPECT_THROW(s.generate(e.encode("Hello", false), options(4, DraftMode::kModel)), Error);
}

// The tiny Gemma 4 pair: E2B-like (6 layers) drafts for E4B-like (8 layers), same vocabulary.
std::unique_ptr<Engine> gemma4_pair() {
  EngineOptions o;
  o.n_ctx = 256;
  o.n_threads = 2;
  auto e = std::make_unique<Engine>(model::tiny_gemma4("e4b_tiny"), o);
  e->load_draft_model(model::tiny_gemma4("e2b_tiny"), o);
  return e;
}

TEST(DraftModelGemma4, TinyPairGivesTheSameTokens) {
  auto e = gemma4_pair();
  auto prompt = model::random_tokens(12, e->model().info().n_vocab, 5);
  for (int i = 0; i < 3; ++i) prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + 12);
  const auto r = same_tokens(*e, prompt, 40, 0.0f, DraftMode::kModel);
  EXPECT_GT(r.drafted_tokens, 0u);
  same_tokens(*e, prompt, 40, 1.0f, DraftMode::kModel);
  // The exact rule with sampled drafts asked for nothing: a draft model drafts greedily then.
  auto o = options(40, DraftMode::kModel, 1.0f);
  o.draft_accept = DraftAccept::kExact;
  Session a(*e), b(*e);
  EXPECT_EQ(a.generate(prompt, o).tokens, b.generate(prompt, options(40, DraftMode::kNone, 1.0f)).tokens);
}

// A copy of `source` with every weight matrix in float32 plus Gaussian noise of `relative` times
// the matrix's RMS (norms and scalars unchanged): a draft model close to its target, whose drafts
// are kept part of the time, so that both acceptance and rejection happen often.
fs::path write_perturbed_copy(const fs::path& source, const fs::path& out, float relative, uint64_t seed) {
  const gguf::File src = gguf::File::open(source);
  gguf::Writer w(out, 32);
  for (const auto& [key, value] : src.metadata()) {
    if (key != "general.alignment") w.add(key, value);
  }
  const auto perturbed = [](const gguf::TensorInfo& t) { return t.shape.size() == 2 && t.shape[0] > 1 && t.shape[1] > 1; };
  for (const auto& t : src.tensors()) w.add_tensor(t.name, perturbed(t) ? gguf::TensorType::kF32 : t.type, t.shape);
  w.begin_data();
  std::mt19937_64 rng(seed);
  for (const auto& t : src.tensors()) {
    const auto bytes = src.tensor_data(t);
    if (!perturbed(t)) {
      w.write(bytes);
      continue;
    }
    std::vector<float> v(t.n_elements);
    gguf::dequantize(t.type, bytes.data(), v.data(), v.size());
    double sum2 = 0;
    for (float x : v) sum2 += static_cast<double>(x) * x;
    std::normal_distribution<float> noise(0.0f, relative * static_cast<float>(std::sqrt(sum2 / static_cast<double>(v.size()))));
    for (auto& x : v) x += noise(rng);
    w.write(std::as_bytes(std::span<const float>(v)));
  }
  w.finish();
  return out;
}

// The chi-square quantile at 1 - alpha, alpha = 1e-6 (Wilson-Hilferty), as in the unit test.
double chi2_critical(size_t df) {
  const double z = 4.753424, k = static_cast<double>(df), a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Two-sample chi-square of equal-size samples: sum over categories of (a - b)^2 / (a + b).
std::pair<double, size_t> chi2_two_sample(const std::map<std::vector<TokenId>, double>& a,
                                          const std::map<std::vector<TokenId>, double>& b) {
  std::set<std::vector<TokenId>> keys;
  for (const auto& [k, v] : a) keys.insert(k);
  for (const auto& [k, v] : b) keys.insert(k);
  double chi2 = 0;
  for (const auto& k : keys) {
    const double x = a.count(k) ? a.at(k) : 0.0, y = b.count(k) ? b.at(k) : 0.0;
    chi2 += (x - y) * (x - y) / (x + y);
  }
  return {chi2, keys.size() > 1 ? keys.size() - 1 : 1};
}

// Speculative sampling end to end: the tiny E4B-like Gemma 4 drafted by a perturbed copy of
// itself (weights + 10 % noise: 44 % of the drafts kept), temperature 1, top-k 6 and a
// repetition penalty (so p and q are whole chains), 5 tokens from a fixed prompt, 1500 seeds
// with and without drafting. Per position, and for the first two tokens jointly, the
// frequencies must agree (two-sample chi-square below the 1e-6 quantile). The same check must
// tell plain sampling at temperature 1 from temperature 1.6 (so it can fail), and drafts must
// have been both kept and rejected often (so both branches of the rule ran).
TEST(DraftModelGemma4, SpeculativeSamplingKeepsTheDistribution) {
  EngineOptions eo;
  eo.n_ctx = 64;
  eo.n_threads = 1;
  auto e = std::make_unique<Engine>(model::tiny_gemma4("e4b_tiny"), eo);
  const fs::path draft = fs::temp_directory_path() / ("kestrel_perturbed_" + std::to_string(::getpid()) + ".gguf");
  write_perturbed_copy(model::tiny_gemma4("e4b_tiny"), draft, 0.1f, 3);
  e->load_draft_model(draft, eo);
  fs::remove(draft);
  const auto prompt = model::random_tokens(10, e->model().info().n_vocab, 21);
  constexpr size_t kSeeds = 1500, kTokens = 5;
  using Counts = std::map<std::vector<TokenId>, double>;
  auto sample = [&](DraftMode mode, DraftAccept accept, float temperature, size_t* drafted, size_t* kept) {
    std::vector<Counts> per_position(kTokens + 1);  // positions 0..3, then (t0, t1)
    Session s(*e);
    for (size_t seed = 0; seed < kSeeds; ++seed) {
      GenerateOptions o = options(kTokens, mode, temperature);
      o.sampler.top_k = 6;
      o.sampler.top_p = 1.0f;
      o.sampler.min_p = 0.0f;
      o.sampler.repeat_penalty = 1.5f;
      o.sampler.seed = 1000 + seed;
      o.draft_accept = accept;
      const auto r = s.generate(prompt, o);
      EXPECT_EQ(r.tokens.size(), kTokens);
      for (size_t j = 0; j < kTokens; ++j) per_position[j][{r.tokens[j]}] += 1;
      per_position[kTokens][{r.tokens[0], r.tokens[1]}] += 1;
      if (drafted) *drafted += r.drafted_tokens;
      if (kept) *kept += r.accepted_tokens;
    }
    return per_position;
  };
  size_t drafted = 0, kept = 0;
  const auto plain = sample(DraftMode::kNone, DraftAccept::kExact, 1.0f, nullptr, nullptr);
  const auto spec = sample(DraftMode::kModel, DraftAccept::kDistribution, 1.0f, &drafted, &kept);
  for (size_t j = 0; j <= kTokens; ++j) {
    SCOPED_TRACE(j < kTokens ? "position " + std::to_string(j) : std::string("first two jointly"));
    const auto [chi2, df] = chi2_two_sample(plain[j], spec[j]);
    EXPECT_LT(chi2, chi2_critical(df)) << "df " << df;
  }
  EXPECT_GT(kept * 5, drafted) << kept << " of " << drafted;
  EXPECT_LT(kept * 5, drafted * 4) << kept << " of " << drafted;
  // The check has power: temperature 1.6 is told apart from 1 at the first position.
  const auto hotter = sample(DraftMode::kNone, DraftAccept::kExact, 1.6f, nullptr, nullptr);
  const auto [chi2, df] = chi2_two_sample(plain[0], hotter[0]);
  EXPECT_GT(chi2, chi2_critical(df));
  std::printf("speculative sampling kept %zu of %zu drafts\n", kept, drafted);
}

}  // namespace
}  // namespace kestrel::runtime
