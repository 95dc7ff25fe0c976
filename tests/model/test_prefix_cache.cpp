// The prefix cache shared by sessions (runtime/prefix_cache.h): a restored prefix leaves a KV
// cache that answers bit for bit as a cache that computed those positions itself, on the tiny
// Gemma 4 models (window 8: blocks of 8, rings of 263 slots that wrap, KV-shared layers) and the
// default Gemma 3 270M (window 512, ring 767); the memory bound; the directory across
// "restarts", with a damaged file and another model's files ignored.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/model/model.h"
#include "kestrel/runtime/prefix_cache.h"
#include "test_models.h"

namespace kestrel::runtime {
namespace {

namespace fs = std::filesystem;
using model::KvCache;
using model::Logits;

struct Loaded {
  gguf::File file;
  ThreadPool pool{2};
  std::unique_ptr<model::Model> model;
  std::vector<float> hidden;
  explicit Loaded(const fs::path& path, model::KvTypes kv = {}) : file(gguf::File::open(path)) {
    model::LoadOptions options;
    options.kv_types = kv;
    model = model::load_model(file, options, pool);
    hidden.resize(model->info().d_model);
  }
  void feed(std::span<const TokenId> t, KvCache& cache) {
    model->forward_hidden(t, cache, Logits::kLast, hidden.data(), pool);
  }
  std::vector<float> logits(std::span<const TokenId> t, KvCache& cache) {
    std::vector<float> out(t.size() * model->info().n_vocab);
    model->forward(t, cache, Logits::kAll, out.data(), pool);
    return out;
  }
};

// Prefills `prompt` in chunks of `chunk` tokens, publishing after each (as the scheduler does:
// a ring shorter than the prompt keeps only its last positions, so blocks are stored while they
// are still whole), restores prefixes of it into fresh caches and checks that the next tokens'
// logits equal those after a cold prefill of the same prefix in one call.
void check_restores_exactly(Loaded& m, size_t n_ctx, size_t prompt_len, size_t chunk, std::vector<size_t> cuts) {
  const auto tokens = model::random_tokens(prompt_len + 16, m.model->info().n_vocab, 7);
  const std::span<const TokenId> prompt(tokens.data(), prompt_len);
  KvCache source = m.model->new_cache(n_ctx);
  PrefixCache pc(source, size_t{1} << 30);
  for (size_t at = 0; at < prompt_len; at += chunk) {
    m.feed(prompt.subspan(at, std::min(chunk, prompt_len - at)), source);
    pc.publish(source);
  }
  ASSERT_EQ(source.prefilled(), prompt_len);
  const size_t block = pc.block_tokens();
  ASSERT_GT(pc.stats().blocks.load(), 0u);
  for (size_t cut : cuts) {
    SCOPED_TRACE("cut " + std::to_string(cut));
    const std::span<const TokenId> query(tokens.data(), cut + 16);
    KvCache restored = m.model->new_cache(n_ctx);
    const size_t n = pc.restore(query, cut, restored);
    ASSERT_EQ(n, std::min(cut, prompt_len) / block * block);
    EXPECT_EQ(restored.n_past, n);
    EXPECT_EQ(restored.prefilled(), n);
    EXPECT_EQ(restored.exact_prefix(n), n);
    const std::span<const TokenId> tail(tokens.data() + n, cut + 16 - n);
    KvCache cold = m.model->new_cache(n_ctx);
    if (n > 0) m.feed(query.first(n), cold);
    EXPECT_EQ(m.logits(tail, restored), m.logits(tail, cold));
  }
}

TEST(PrefixCache, RestoredPrefixAnswersAsAColdPrefillTinyGemma4) {
  for (const char* name : {"e2b_tiny", "e4b_tiny"}) {
    SCOPED_TRACE(name);
    Loaded m(model::tiny_gemma4(name));
    // Window 8: blocks of 8; 496 positions wrap the 263-slot rings.
    check_restores_exactly(m, 512, 496, 128, {8, 16, 100, 262, 263, 300, 496});
  }
}

TEST(PrefixCache, RestoredPrefixAnswersAsAColdPrefillGemma3) {
  KESTREL_DEFAULT_MODEL_OR_SKIP(path);
  Loaded m(path);
  // Window 512, ring 767: 1,100 positions wrap it.
  check_restores_exactly(m, 2048, 1100, 256, {96, 1088});
}

// The int8 KV cache (--cache-type-k/-v q8): blocks copy its int8 values and scales, and a
// restored prefix answers as a cold q8 prefill, bit for bit.
TEST(PrefixCache, RestoredQ8PrefixAnswersAsAColdQ8Prefill) {
  for (const char* name : {"e2b_tiny", "e4b_tiny"}) {
    SCOPED_TRACE(name);
    Loaded m(model::tiny_gemma4(name), {model::KvType::kQ8, model::KvType::kQ8});
    check_restores_exactly(m, 512, 496, 128, {8, 100, 263, 496});
  }
  Loaded m(model::tiny_gemma4("e4b_tiny"), {model::KvType::kF16, model::KvType::kQ8});
  check_restores_exactly(m, 512, 300, 128, {100, 300});
  Loaded r(model::tiny_gemma4("e4b_tiny"), {model::KvType::kQ8, model::KvType::kQ8, true});  // rotated
  check_restores_exactly(r, 512, 300, 128, {100, 300});
}

TEST(PrefixCache, RestoredQ8PrefixAnswersAsAColdQ8PrefillGemma3) {
  KESTREL_DEFAULT_MODEL_OR_SKIP(path);
  Loaded m(path, {model::KvType::kQ8, model::KvType::kQ8});
  check_restores_exactly(m, 2048, 1100, 256, {96, 1088});
}

// A q8 block takes 1 + 2/32 bytes per element where f16 takes 2: 17/32 of the bytes.
TEST(PrefixCache, Q8BlocksTakeSeventeenThirtySecondsOfF16s) {
  Loaded f16(model::tiny_gemma4("e4b_tiny")), q8(model::tiny_gemma4("e4b_tiny"), {model::KvType::kQ8, model::KvType::kQ8});
  const KvCache a = f16.model->new_cache(256), b = q8.model->new_cache(256);
  EXPECT_EQ(PrefixCache(b, 0).block_bytes() * 32, PrefixCache(a, 0).block_bytes() * 17);
  EXPECT_EQ(b.bytes() * 32, a.bytes() * 17);
}

// Files record the KV type: a directory written with an f16 cache is not read into a q8 one
// (even under the same model id), with a warning, and the other way round.
TEST(PrefixCache, AFileOfAnotherKvTypeIsIgnored) {
  Loaded f16(model::tiny_gemma4("e4b_tiny")), q8(model::tiny_gemma4("e4b_tiny"), {model::KvType::kQ8, model::KvType::kQ8});
  const auto a = model::random_tokens(64, f16.model->info().n_vocab, 5);
  const fs::path dir = fs::temp_directory_path() / ("kestrel-prefix-kv-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  KvCache source = f16.model->new_cache(256);
  f16.feed(a, source);
  { PrefixCache(source, size_t{1} << 30, dir, "model A").publish(source); }
  KvCache q8_cache = q8.model->new_cache(256);
  {
    PrefixCache reader(q8_cache, size_t{1} << 30, dir, "model A");
    EXPECT_EQ(reader.match(a, 64), 0u);
    EXPECT_EQ(reader.stats().disk_rejected.load(), 1u);
  }
  {  // In memory: restoring f16 blocks into a q8 cache is an error, not a misread.
    PrefixCache mem(source, size_t{1} << 30);
    mem.publish(source);
    EXPECT_THROW(mem.restore(a, 64, q8_cache), Error);
  }
  {
    PrefixCache same(source, size_t{1} << 30, dir, "model A");
    EXPECT_EQ(same.match(a, 64), 64u);
    EXPECT_EQ(same.stats().disk_rejected.load(), 0u);
  }
  fs::remove_all(dir);
}

TEST(PrefixCache, ADifferentPrefixFindsNothing) {
  Loaded m(model::tiny_gemma4("e4b_tiny"));
  const auto a = model::random_tokens(64, m.model->info().n_vocab, 1);
  auto b = a;
  b[3] += 1;  // one token differs early: nothing after it may be reused
  KvCache source = m.model->new_cache(256);
  m.feed(a, source);
  PrefixCache pc(source, size_t{1} << 30);
  pc.publish(source);
  EXPECT_EQ(pc.match(a, 64), 64u);
  EXPECT_EQ(pc.match(b, 64), 0u);
  KvCache other = m.model->new_cache(256);
  EXPECT_EQ(pc.restore(b, 64, other), 0u);
  EXPECT_EQ(other.n_past, 0u);
}

TEST(PrefixCache, StaysWithinItsBoundDroppingLeavesFirst) {
  Loaded m(model::tiny_gemma4("e4b_tiny"));
  const auto a = model::random_tokens(200, m.model->info().n_vocab, 2);
  const auto b = model::random_tokens(200, m.model->info().n_vocab, 3);
  KvCache ca = m.model->new_cache(256), cb = m.model->new_cache(256);
  m.feed(a, ca);
  m.feed(b, cb);
  PrefixCache probe(ca, 0);
  ASSERT_GT(200 / probe.block_tokens(), 4u);
  const size_t limit = 4 * probe.block_bytes();
  PrefixCache pc(ca, limit);
  pc.publish(ca);
  EXPECT_LE(pc.stats().bytes.load(), limit);
  // The chain is longer than the bound: its first blocks are kept (a suffix without its start is
  // of no use).
  EXPECT_EQ(pc.match(a, 200), 4 * pc.block_tokens());
  pc.publish(cb);
  EXPECT_LE(pc.stats().bytes.load(), limit);
  EXPECT_EQ(pc.match(b, 200), 4 * pc.block_tokens());
  EXPECT_EQ(pc.match(a, 200), 0u);  // the older chain went
  EXPECT_GT(pc.stats().evicted_blocks.load(), 0u);
  EXPECT_EQ(PrefixCache(ca, 0).match(a, 200), 0u);  // a bound of 0 keeps nothing
}

TEST(PrefixCache, DirectoryKeepsBlocksAcrossRestartsAndIgnoresDamage) {
  Loaded m(model::tiny_gemma4("e4b_tiny"));
  const auto a = model::random_tokens(120, m.model->info().n_vocab, 4);
  const fs::path dir = fs::temp_directory_path() / ("kestrel-prefix-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  KvCache source = m.model->new_cache(256);
  m.feed(a, source);
  size_t block = 0;
  {
    PrefixCache pc(source, size_t{1} << 30, dir, "model A");
    pc.publish(source);
    block = pc.block_tokens();
  }  // shutdown writes every block
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 120 / block);

  const std::span<const TokenId> query(a.data(), 120);
  {
    PrefixCache restarted(source, size_t{1} << 30, dir, "model A");
    KvCache restored = m.model->new_cache(256);
    EXPECT_EQ(restarted.restore(query, 112, restored), 112 / block * block);
    EXPECT_EQ(restarted.stats().disk_reads.load(), 112 / block);
    const std::span<const TokenId> tail(a.data() + restored.n_past, 120 - restored.n_past);
    KvCache cold = m.model->new_cache(256);
    m.feed(query.first(restored.n_past), cold);
    EXPECT_EQ(m.logits(tail, restored), m.logits(tail, cold));
  }
  {
    PrefixCache other_model(source, size_t{1} << 30, dir, "model B");
    EXPECT_EQ(other_model.match(query, 112), 0u);
  }
  // Damage the second block (positions block .. 2 * block): the prefix ends before it, with a
  // warning. Its file: the one holding those positions' token ids (after the 56-byte header).
  fs::path damaged;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::vector<TokenId> ids(block);
    std::memcpy(ids.data(), bytes.data() + 56, block * sizeof(TokenId));
    if (std::equal(ids.begin(), ids.end(), a.begin() + static_cast<std::ptrdiff_t>(block))) damaged = f;
  }
  ASSERT_FALSE(damaged.empty());
  {
    std::fstream io(damaged, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(fs::file_size(damaged) / 2));
    io.put('\x5a');
  }
  {
    PrefixCache after(source, size_t{1} << 30, dir, "model A");
    EXPECT_EQ(after.match(query, 112), block);
    EXPECT_EQ(after.stats().disk_rejected.load(), 1u);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kestrel::runtime
