// Model::forward_batch against forward_hidden: several sequences with different histories in
// their caches (none, short, beyond the sliding window so that rings wrap), one batch mixing
// decode rows and prefill chunks. Each sequence's hidden state must match forward_hidden of the
// same tokens on a cache fed the same history, and so must the logits of one further token fed
// to both caches (the batch wrote the caches right). Bit-identical where every matrix takes the
// same kernel path for the batch's row count as for the sequence alone (F32 and Q8_0 weights,
// or fewer than 8 rows in all); W4 and BF16 weights switch to bfloat16 tiles at 8 rows, so a
// decode row batched with 7 or more others is rounded differently (within a stated tolerance,
// printed next to the difference between an 8-row chunk and a decode step of one sequence
// alone, the same rounding without batching).
// The tiny Gemma 4 models (window 8, ring 263 slots, KV-shared layers) and the default Gemma 3
// 270M (window 512, ring 767 slots).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/head/output_head.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/model/model.h"
#include "kestrel/runtime/model_path.h"
#include "test_models.h"

namespace kestrel::model {
namespace {

namespace fs = std::filesystem;

fs::path tiny(const char* name) { return tiny_gemma4(name); }

struct Loaded {
  gguf::File file;
  ThreadPool pool{2};
  std::unique_ptr<Model> model;
  Loaded(const fs::path& path, Precision precision,
         kernels::DecodeActivations decode = kernels::DecodeActivations::kAuto, KvTypes kv = {})
      : file(gguf::File::open(path)) {
    LoadOptions options;
    options.precision = precision;
    options.decode_activations = decode;
    options.kv_types = kv;
    model = load_model(file, options, pool);
  }
  size_t d() const { return model->info().d_model; }
  size_t n_vocab() const { return model->info().n_vocab; }
  /// A fresh cache of n_ctx holding `history`: a copy of the one prefilled the first time these
  /// tokens were asked for (the Gemma 3 checks share histories; CI time).
  KvCache fed(const std::vector<TokenId>& history, size_t n_ctx) {
    auto [it, fresh] = prefilled.try_emplace({history, n_ctx});
    if (fresh) {
      it->second = model->new_cache(n_ctx);
      std::vector<float> hidden(d());
      if (!history.empty()) model->forward_hidden(history, it->second, Logits::kLast, hidden.data(), pool);
    }
    return it->second;
  }
  std::map<std::pair<std::vector<TokenId>, size_t>, KvCache> prefilled;
  std::vector<float> logits(const std::vector<float>& hidden, size_t rows) {
    std::vector<float> out(rows * n_vocab());
    head::dense_logits(model->output_head(), hidden.data(), rows, out.data(), pool);
    return out;
  }
};

/// One sequence of a batch: `history` tokens already in its cache, `n_new` tokens in the batch.
struct Part {
  size_t history = 0;
  size_t n_new = 0;
};

/// Largest differences between the batch and forward_hidden alone, over all sequences.
struct Agreement {
  float hidden = 0.0f;       // max |hidden difference|
  float logits = 0.0f;       // max |difference| of dense_logits of those hidden states
  float next_logits = 0.0f;  // max |difference| of the logits of one further token fed to both caches
  bool argmax_same = true;   // for both kinds of logits
  // For scale, without batching: max |difference| of the logits of each decode row's token run
  // alone (1 row) and as the last of an 8-row chunk (the prefill kernels), same cache contents.
  float prefill_vs_decode = 0.0f;
};

size_t argmax(const float* z, size_t n) { return static_cast<size_t>(std::max_element(z, z + n) - z); }

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

bool same_argmax(const std::vector<float>& a, const std::vector<float>& b, size_t rows, size_t n) {
  for (size_t r = 0; r < rows; ++r) {
    if (argmax(&a[r * n], n) != argmax(&b[r * n], n)) return false;
  }
  return true;
}

/// Runs `parts` as one forward_batch and each alone; with `reference`, also measures
/// prefill_vs_decode.
Agreement batch_vs_alone(Loaded& m, const std::vector<Part>& parts, size_t n_ctx, bool reference) {
  const size_t d = m.d(), V = m.n_vocab(), n = parts.size();
  std::vector<std::vector<TokenId>> history(n), fresh(n);
  std::vector<KvCache> batched, alone;
  for (size_t i = 0; i < n; ++i) {
    history[i] = random_tokens(parts[i].history, V, 100 + parts[i].history);  // shared by checks
    fresh[i] = random_tokens(parts[i].n_new, V, 200 + i);
    batched.push_back(m.fed(history[i], n_ctx));
    alone.push_back(batched.back());  // the same contents, prefilled once (CI time)
  }
  std::vector<float> hidden_batch(n * d), hidden_alone(n * d);
  std::vector<BatchSequence> seqs(n);
  for (size_t i = 0; i < n; ++i) seqs[i] = {fresh[i], &batched[i], &hidden_batch[i * d]};
  m.model->forward_batch(seqs, m.pool);
  for (size_t i = 0; i < n; ++i) {
    m.model->forward_hidden(fresh[i], alone[i], Logits::kLast, &hidden_alone[i * d], m.pool);
    EXPECT_EQ(batched[i].n_past, alone[i].n_past);
    EXPECT_TRUE(std::ranges::equal(batched[i].tokens(), alone[i].tokens()));
  }
  Agreement a;
  a.hidden = max_abs_diff(hidden_batch, hidden_alone);
  const auto logits_batch = m.logits(hidden_batch, n), logits_alone = m.logits(hidden_alone, n);
  a.logits = max_abs_diff(logits_batch, logits_alone);
  a.argmax_same = same_argmax(logits_batch, logits_alone, n, V);
  // One further token through each cache alone: differences now come from the caches only.
  std::vector<float> next_batch(n * V), next_alone(n * V);
  for (size_t i = 0; i < n; ++i) {
    const std::vector<TokenId> next = random_tokens(1, V, 300 + i);
    m.model->forward(next, batched[i], Logits::kLast, &next_batch[i * V], m.pool);
    m.model->forward(next, alone[i], Logits::kLast, &next_alone[i * V], m.pool);
  }
  a.next_logits = max_abs_diff(next_batch, next_alone);
  a.argmax_same = a.argmax_same && same_argmax(next_batch, next_alone, n, V);
  for (size_t i = 0; reference && i < n; ++i) {
    if (parts[i].n_new != 1 || parts[i].history < 7) continue;
    const size_t h = parts[i].history;
    KvCache cache = m.fed({history[i].begin(), history[i].end() - 7}, n_ctx);
    std::vector<TokenId> chunk(history[i].end() - 7, history[i].end());
    chunk.push_back(fresh[i][0]);
    std::vector<float> hidden(d);
    m.model->forward_hidden(chunk, cache, Logits::kLast, hidden.data(), m.pool);
    EXPECT_EQ(cache.n_past, h + 1);
    const std::vector<float> one(&hidden_alone[i * d], &hidden_alone[(i + 1) * d]);
    a.prefill_vs_decode = std::max(a.prefill_vs_decode, max_abs_diff(m.logits(hidden, 1), m.logits(one, 1)));
  }
  return a;
}

/// Runs batch_vs_alone, prints what it measured, and checks it: all zero when `exact`, else
/// logits within `tolerance` and the same argmax.
void check(Loaded& m, const std::string& what, const std::vector<Part>& parts, size_t n_ctx, bool exact,
           float tolerance) {
  SCOPED_TRACE(what);
  const Agreement a = batch_vs_alone(m, parts, n_ctx, !exact);
  std::printf("%s: max |diff| hidden %.3g, logits %.3g, next-token logits %.3g, argmax %s", what.c_str(),
              static_cast<double>(a.hidden), static_cast<double>(a.logits), static_cast<double>(a.next_logits),
              a.argmax_same ? "same" : "DIFFERS");
  if (!exact) std::printf(" (alone, 8-row chunk vs decode: logits %.3g)", static_cast<double>(a.prefill_vs_decode));
  std::printf("\n");
  if (exact) {
    EXPECT_EQ(a.hidden, 0.0f);
    EXPECT_EQ(a.logits, 0.0f);
    EXPECT_EQ(a.next_logits, 0.0f);
  } else {
    EXPECT_LE(a.logits, tolerance);
    EXPECT_LE(a.next_logits, tolerance);
  }
  EXPECT_TRUE(a.argmax_same);
}

// A prefill chunk from nothing, decode rows at short and wrapped-ring histories, and a prefill
// chunk that crosses the ring's wrap: 20 + 1 + 1 + 1 + 20 = 43 rows.
const std::vector<Part> kMixedTiny = {{0, 20}, {5, 1}, {37, 1}, {300, 1}, {290, 20}};
// Decode rows only, fewer than 8: every matrix takes its decode path as it does alone.
const std::vector<Part> kDecodeTiny = {{0, 1}, {5, 1}, {37, 1}, {300, 1}};

TEST(ForwardBatch, MatchesForwardHiddenGemma4Tiny) {
  for (const char* name : {"e2b_tiny", "e4b_tiny"}) {
    {
      Loaded m(tiny(name), Precision::kSource);
      check(m, std::string(name) + " source, mixed", kMixedTiny, 512, true, 0.0f);
      check(m, std::string(name) + " source, decode", kDecodeTiny, 512, true, 0.0f);
    }
    Loaded m(tiny(name), Precision::kBF16);
    // Measured: max |logit diff| e2b 0.066, e4b 0.13 (8-row chunk vs decode alone: 0.048, 0.080).
    check(m, std::string(name) + " bf16, mixed", kMixedTiny, 512, false, 0.25f);
    check(m, std::string(name) + " bf16, decode", kDecodeTiny, 512, true, 0.0f);
  }
}

TEST(ForwardBatch, MatchesForwardHiddenGemma3) {
  KESTREL_DEFAULT_MODEL_OR_SKIP(path)
  // Ring 767 slots: histories of 800 and 780 have wrapped it.
  const std::vector<Part> mixed = {{0, 20}, {5, 1}, {37, 1}, {300, 1}, {800, 1}, {780, 20}};
  const std::vector<Part> decode = {{5, 1}, {37, 1}, {800, 1}};
  {
    Loaded m(path, Precision::kSource);
    check(m, "gemma3 source, mixed", mixed, 1024, true, 0.0f);
    check(m, "gemma3 source, decode", decode, 1024, true, 0.0f);
  }
  // W4A16 only adds the kernels' rounding: shorter histories (the rings are covered above).
  const std::vector<Part> mixed_w4 = {{0, 20}, {5, 1}, {37, 1}, {300, 1}, {280, 20}};
  const std::vector<Part> decode_w4 = {{5, 1}, {37, 1}, {300, 1}};
  {
    Loaded m(path, Precision::kW4A16, kernels::DecodeActivations::kBf16);
    // Measured: max |logit diff| 0.65 (the decode row at position 5, logits up to 37; the other
    // decode rows 0.08-0.14, the prefill rows 0), next-token 0.34; 8-row chunk vs decode alone 0.14.
    check(m, "gemma3 w4a16 bf16 decode, mixed", mixed_w4, 1024, false, 1.0f);
    check(m, "gemma3 w4a16 bf16 decode, decode", decode_w4, 1024, true, 0.0f);
  }
  // With int8 decode activations a mixed batch's decode rows (bf16 tiles) differ from the rows
  // alone (int8) by the activations' rounding as well. Measured: max |logit diff| 1.33 over the
  // whole vocabulary of random tokens, next-token 0.86; 8-row chunk vs decode alone 0.58 (the
  // scheduler never mixes them: decode rows go in groups of fewer than 8). Decode rows batched
  // together stay bit-identical to the rows alone.
  Loaded m(path, Precision::kW4A16, kernels::DecodeActivations::kInt8);
  check(m, "gemma3 w4a16 int8 decode, mixed", mixed_w4, 1024, false, 2.0f);
  check(m, "gemma3 w4a16 int8 decode, decode", decode_w4, 1024, true, 0.0f);
}

// The int8 KV cache (--cache-type-k/-v q8) keeps the promise: the rows of a batch read and write
// their caches as they would alone, bit for bit where the matrices take the same path.
TEST(ForwardBatch, Q8KvCacheMatchesForwardHidden) {
  const KvTypes q8{KvType::kQ8, KvType::kQ8};
  for (const char* name : {"e2b_tiny", "e4b_tiny"}) {
    Loaded m(tiny(name), Precision::kSource, kernels::DecodeActivations::kAuto, q8);
    ASSERT_EQ(m.model->new_cache(16).types(), q8);
    check(m, std::string(name) + " source, q8 KV, mixed", kMixedTiny, 512, true, 0.0f);
    check(m, std::string(name) + " source, q8 KV, decode", kDecodeTiny, 512, true, 0.0f);
  }
  // Hadamard-rotated heads (KvTypes::k_hadamard): the queries and outputs are rotated per row.
  {
    KvTypes rotated = q8;
    rotated.k_hadamard = true;
    Loaded r(tiny("e4b_tiny"), Precision::kSource, kernels::DecodeActivations::kAuto, rotated);
    check(r, "e4b_tiny source, q8 KV rotated, mixed", kMixedTiny, 512, true, 0.0f);
  }
  // Mixed types too: K q8, V f16.
  Loaded m(tiny("e4b_tiny"), Precision::kSource, kernels::DecodeActivations::kAuto, {KvType::kQ8, KvType::kF16});
  check(m, "e4b_tiny source, K q8 V f16, mixed", kMixedTiny, 512, true, 0.0f);
}

TEST(ForwardBatch, Q8KvCacheMatchesForwardHiddenGemma3) {
  KESTREL_DEFAULT_MODEL_OR_SKIP(path)
  // The default load (int8 activations where the CPU has them): decode rows batched together are
  // bit-identical to the rows alone; ring 767 slots wrapped at 800.
  Loaded m(path, Precision::kAuto, kernels::DecodeActivations::kAuto, {KvType::kQ8, KvType::kQ8});
  check(m, "gemma3 auto, q8 KV, decode", {{5, 1}, {37, 1}, {800, 1}}, 1024, true, 0.0f);
}

bool same_cache(const KvCache& a, const KvCache& b) {
  if (a.n_past != b.n_past || !std::ranges::equal(a.tokens(), b.tokens())) return false;
  for (size_t il = 0; il < a.layers.size(); ++il) {
    if (a.layers[il].k != b.layers[il].k || a.layers[il].v != b.layers[il].v) return false;
  }
  return true;
}

TEST(ForwardBatch, BadInputIsAnErrorAndChangesNoCache) {
  Loaded m(tiny("e2b_tiny"), Precision::kSource);
  const size_t V = m.n_vocab();
  EXPECT_EQ(m.model->max_batch_tokens(), 256u);
  std::vector<KvCache> caches;
  caches.push_back(m.fed(random_tokens(10, V, 1), 512));
  caches.push_back(m.fed(random_tokens(60, V, 2), 64));
  caches.push_back(m.fed({}, 512));
  const std::vector<KvCache> before = caches;
  const auto ok = random_tokens(3, V, 3), big = random_tokens(200, V, 4), small = random_tokens(57, V, 5);
  const std::vector<TokenId> empty, overflow = random_tokens(5, V, 6);  // 60 + 5 > 64
  const std::vector<TokenId> bad_id = {5, static_cast<TokenId>(V)}, negative = {-1};
  std::vector<float> hidden(m.d());
  KvCache* c0 = &caches[0];
  KvCache* c1 = &caches[1];
  KvCache* c2 = &caches[2];
  const std::vector<std::pair<const char*, std::vector<BatchSequence>>> bad = {
      {"no sequences", {}},
      {"260 tokens", {{ok, c1, nullptr}, {big, c0, nullptr}, {small, c2, nullptr}}},
      {"an empty sequence", {{ok, c0, hidden.data()}, {empty, c2, nullptr}}},
      {"the same cache twice", {{ok, c0, nullptr}, {ok, c2, nullptr}, {ok, c0, nullptr}}},
      {"no cache", {{ok, c0, nullptr}, {ok, nullptr, nullptr}}},
      {"overflow of its context", {{ok, c0, nullptr}, {overflow, c1, nullptr}}},
      {"an id outside the vocabulary", {{ok, c0, nullptr}, {ok, c1, nullptr}, {bad_id, c2, nullptr}}},
      {"a negative id", {{negative, c2, nullptr}}},
  };
  for (const auto& [what, seqs] : bad) {
    SCOPED_TRACE(what);
    EXPECT_THROW(m.model->forward_batch(seqs, m.pool), Error);
    for (size_t i = 0; i < caches.size(); ++i) EXPECT_TRUE(same_cache(caches[i], before[i])) << "cache " << i;
  }
  // A cache of another model (one layer).
  KvCache foreign = KvCache::allocate(64, {{64, 16, 0}});
  const std::vector<BatchSequence> mixed_models = {{ok, c0, nullptr}, {ok, &foreign, nullptr}};
  EXPECT_THROW(m.model->forward_batch(mixed_models, m.pool), Error);
  EXPECT_TRUE(same_cache(caches[0], before[0]));
  EXPECT_EQ(foreign.n_past, 0u);
  // 256 tokens in all is allowed.
  const auto fill = random_tokens(256 - big.size(), V, 7);
  const std::vector<BatchSequence> at_limit = {{big, c0, nullptr}, {fill, c2, hidden.data()}};
  EXPECT_NO_THROW(m.model->forward_batch(at_limit, m.pool));
  EXPECT_EQ(caches[0].n_past, 10u + big.size());
  EXPECT_EQ(caches[2].n_past, fill.size());
}

}  // namespace
}  // namespace kestrel::model
