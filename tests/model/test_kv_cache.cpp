// The KV cache's truncate / rollback contract (model/kv_cache.h) on real decoders: after
// truncate(n), feeding tokens gives bit-for-bit the logits of a cache that only ever held the
// first n tokens; at a sliding-window ring's edge truncate keeps exactly what the ring still
// holds, and one position further it keeps nothing, because reading on would be wrong (shown by
// bypassing the rule). The tiny Gemma 4 models (window 8, ring 263 slots, KV-shared layers) and
// the default Gemma 3 270M (window 512, ring 767 slots).
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/model/model.h"
#include "kestrel/runtime/model_path.h"
#include "test_models.h"

namespace kestrel::model {
namespace {

namespace fs = std::filesystem;

std::span<const TokenId> first(const std::vector<TokenId>& v, size_t n) { return {v.data(), n}; }

struct Loaded {
  gguf::File file;
  ThreadPool pool{2};
  std::unique_ptr<Model> model;
  explicit Loaded(const fs::path& path, LoadOptions options = {}) : file(gguf::File::open(path)) {
    model = load_model(file, options, pool);
  }
  /// Logits of every token of `tail` after feeding `head` to a fresh cache of n_ctx.
  std::vector<float> fresh(std::span<const TokenId> head, std::span<const TokenId> tail, size_t n_ctx) {
    KvCache cache = model->new_cache(n_ctx);
    if (!head.empty()) model->forward_hidden(head, cache, Logits::kLast, nullptr_hidden(), pool);
    return logits(tail, cache);
  }
  std::vector<float> logits(std::span<const TokenId> tail, KvCache& cache) {
    std::vector<float> out(tail.size() * model->info().n_vocab);
    model->forward(tail, cache, Logits::kAll, out.data(), pool);
    return out;
  }
  float* nullptr_hidden() {
    scratch.resize(model->info().d_model);
    return scratch.data();
  }
  std::vector<float> scratch;
};

// Truncates `cache` (which holds `a` and then other tokens) to n, re-feeds what of a[0, n) it
// could not keep, then `b`; returns (positions kept, logits of b).
std::pair<size_t, std::vector<float>> rollback_and_feed(Loaded& m, KvCache cache, const std::vector<TokenId>& a,
                                                        size_t n, const std::vector<TokenId>& b) {
  const size_t kept = cache.truncate(n);
  EXPECT_EQ(cache.n_past, kept);
  EXPECT_EQ(cache.tokens().size(), kept);
  if (kept < n) m.model->forward_hidden(std::span(a).subspan(kept, n - kept), cache, Logits::kLast, m.nullptr_hidden(), m.pool);
  return {kept, m.logits(b, cache)};
}

// Feeds `a` then `junk`, truncates to n, feeds `b`; returns (positions kept, logits of b).
// split_at_n: `a` goes in two chunks, its first n tokens and the rest, so that those n are
// computed as a fresh prefill of them is (a chunk of fewer than kernels::kTileMinTokens tokens
// computes its rows as decode steps, not as the same positions inside a longer chunk).
std::pair<size_t, std::vector<float>> after_rollback(Loaded& m, const std::vector<TokenId>& a,
                                                     const std::vector<TokenId>& junk, size_t n,
                                                     const std::vector<TokenId>& b, size_t n_ctx,
                                                     bool split_at_n = false) {
  KvCache cache = m.model->new_cache(n_ctx);
  if (split_at_n && n > 0 && n < a.size()) {
    m.model->forward_hidden(first(a, n), cache, Logits::kLast, m.nullptr_hidden(), m.pool);
    m.model->forward_hidden(std::span(a).subspan(n), cache, Logits::kLast, m.nullptr_hidden(), m.pool);
  } else {
    m.model->forward_hidden(a, cache, Logits::kLast, m.nullptr_hidden(), m.pool);
  }
  m.model->forward_hidden(junk, cache, Logits::kLast, m.nullptr_hidden(), m.pool);
  EXPECT_EQ(cache.tokens().size(), a.size() + junk.size());
  return rollback_and_feed(m, std::move(cache), a, n, b);
}

// The ring edge: after P positions, a ring of C slots holds P - C .. P - 1; a query at n needs
// n - W + 1 .. n - 1. truncate(n) keeps n exactly when n - W + 1 >= P - C.
void check_ring_edges(Loaded& m, size_t window, size_t ring, size_t n_a, size_t n_junk, size_t n_ctx) {
  const size_t n_vocab = m.model->info().n_vocab;
  const auto a = random_tokens(n_a, n_vocab, 1), junk = random_tokens(n_junk, n_vocab, 2);
  const auto b = random_tokens(12, n_vocab, 3);
  const size_t floor = n_a + n_junk - ring;
  const size_t edge = floor + window - 1;  // the smallest n that is still exact
  ASSERT_LT(edge, n_a);

  // a then junk, fed once; each case rolls back a copy (CI time).
  KvCache fed = m.model->new_cache(n_ctx);
  m.model->forward_hidden(a, fed, Logits::kLast, m.nullptr_hidden(), m.pool);
  m.model->forward_hidden(junk, fed, Logits::kLast, m.nullptr_hidden(), m.pool);
  ASSERT_EQ(fed.tokens().size(), n_a + n_junk);
  for (const size_t n : {n_a, edge}) {
    const auto [kept, logits] = rollback_and_feed(m, fed, a, n, b);
    EXPECT_EQ(kept, n) << "truncate(" << n << ")";
    EXPECT_EQ(logits, m.fresh(first(a, n), b, n_ctx)) << "truncate(" << n << ") then feeding is not bit-identical";
  }
  // One position before the edge the ring has lost position edge - W: truncate keeps nothing,
  // and re-feeding from 0 is exact again.
  const auto [kept, logits] = rollback_and_feed(m, fed, a, edge - 1, b);
  EXPECT_EQ(kept, 0u);
  EXPECT_EQ(logits, m.fresh(first(a, edge - 1), b, n_ctx));

  // Bypassing the rule (pretending the ring still holds the window) would change the logits:
  // the rule is needed, not just cautious.
  KvCache cache = fed;
  cache.n_past = edge - 1;
  EXPECT_NE(m.logits(b, cache), m.fresh(first(a, edge - 1), b, n_ctx));
}

TEST(KvCache, TruncateIsExactAtTheSlidingRingsEdgesGemma4Tiny) {
  for (const char* name : {"e2b_tiny", "e4b_tiny"}) {
    SCOPED_TRACE(name);
    Loaded m(tiny_gemma4(name));
    // window 8, ring 8 + 256 - 1 = 263 slots; 300 + 100 positions written.
    check_ring_edges(m, 8, 263, 300, 100, 512);
  }
}

TEST(KvCache, TruncateIsExactAtTheSlidingRingsEdgesGemma3) {
  KESTREL_DEFAULT_MODEL_OR_SKIP(path)
  // The GGUF's auto form as `kestrel run -m GGUF` loads it (the float32 source path is covered
  // by the tiny Gemma 4s above): int8 activations where the CPU has AVX2 or VNNI, ~3x faster to
  // prefill than float32 on CPUs without AVX-512 (CI time); bit-exact either way (measured with
  // bf16 and int8 on an AVX2 Zen 1). Where the CPU has AVX512-BF16 its prefill attention is the
  // bfloat16 tile (kernels/attention_bf16.h), converted from another first position for a
  // prefix than for the whole: exact too, since a query's output does not depend on its tile.
  LoadOptions options;
  options.precision = quant::Precision::kAuto;
  Loaded m(path, options);
  // window 512, ring 512 + 256 - 1 = 767 slots; 800 + 150 positions written.
  check_ring_edges(m, 512, 767, 800, 150, 1024);
}

TEST(KvCache, APromptGivesTheSameBitsHoweverItIsCutIntoPiecesOfATileOrMore) {
  // forward_hidden cuts a long prompt into 256-token passes; 256 k + 1..7 tokens left a last
  // pass under kTileMinTokens (decode kernels, other rounding), so `kestrel run` and the
  // server (whose scheduler cuts no such piece) answered differently. Now 263 tokens in one call
  // equal 100 + 163 and 255 + 8 (auto form: int8 products, and the bfloat16 attention tile
  // where the CPU has AVX512-BF16).
  KESTREL_DEFAULT_MODEL_OR_SKIP(path)
  LoadOptions options;
  options.precision = quant::Precision::kAuto;
  Loaded m(path, options);
  const auto a = random_tokens(263, m.model->info().n_vocab, 5), b = random_tokens(1, m.model->info().n_vocab, 6);
  const auto whole = m.fresh(a, b, 512);
  for (const size_t cut : {size_t{100}, size_t{255}}) {
    KvCache cache = m.model->new_cache(512);
    m.model->forward_hidden(first(a, cut), cache, Logits::kLast, m.nullptr_hidden(), m.pool);
    m.model->forward_hidden(std::span(a).subspan(cut), cache, Logits::kLast, m.nullptr_hidden(), m.pool);
    EXPECT_EQ(m.logits(b, cache), whole) << "cut at " << cut;
  }
}

TEST(KvCache, PrefilledCountsTheLeadingPositionsThatPrefillSizedChunksWrote) {
  // A prompt reuses only positions a cold run would have written the same way (prefill tiles):
  // not a short prompt's rows (a 2-token first request's BOS, reused by every later prompt,
  // changed their greedy answers on the server), nor decode steps'.
  Loaded m(tiny_gemma4("e2b_tiny"));
  const auto a = random_tokens(20, m.model->info().n_vocab, 4);
  KvCache cache = m.model->new_cache(64);
  m.model->forward_hidden(first(a, 3), cache, Logits::kLast, m.nullptr_hidden(), m.pool);
  EXPECT_EQ(cache.prefilled(), 0u) << "a prompt under a tile: rows";
  cache.clear();
  m.model->forward_hidden(first(a, 12), cache, Logits::kLast, m.nullptr_hidden(), m.pool);
  EXPECT_EQ(cache.prefilled(), 12u);
  m.model->forward_hidden(std::span(a).subspan(12, 1), cache, Logits::kLast, m.nullptr_hidden(), m.pool);
  EXPECT_EQ(cache.prefilled(), 12u) << "a decode step";
  m.model->forward_hidden(std::span(a).subspan(13, 7), cache, Logits::kLast, m.nullptr_hidden(), m.pool);
  EXPECT_EQ(cache.n_past, 20u);
  EXPECT_EQ(cache.prefilled(), 12u) << "after rows, prefill-sized chunks no longer count";
  EXPECT_EQ(cache.truncate(10), 10u);
  EXPECT_EQ(cache.prefilled(), 10u);
  m.model->forward_hidden(std::span(a).subspan(10, 10), cache, Logits::kLast, m.nullptr_hidden(), m.pool);
  EXPECT_EQ(cache.prefilled(), 20u);
  cache.clear();
  EXPECT_EQ(cache.prefilled(), 0u);
}

TEST(KvCache, TruncateWithinTheRingAndBadArguments) {
  Loaded m(tiny_gemma4("e2b_tiny"));
  const size_t n_vocab = m.model->info().n_vocab;
  const auto a = random_tokens(40, n_vocab, 4), b = random_tokens(5, n_vocab, 5);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{39}, size_t{40}}) {
    const auto [kept, logits] = after_rollback(m, a, random_tokens(20, n_vocab, 6), n, b, 128, true);
    EXPECT_EQ(kept, n);
    EXPECT_EQ(logits, m.fresh(first(a, n), b, 128)) << "truncate(" << n << ")";
  }
  KvCache cache = m.model->new_cache(64);
  m.model->forward_hidden(a, cache, Logits::kLast, m.nullptr_hidden(), m.pool);
  EXPECT_THROW(cache.truncate(41), Error);
  EXPECT_EQ(cache.n_past, 40u);
  EXPECT_EQ(common_prefix(cache.tokens(), a), 40u);
  cache.clear();
  EXPECT_EQ(cache.tokens().size(), 0u);
}

}  // namespace
}  // namespace kestrel::model
