// The GGUF image cache (runtime/image_cache.h, image/auto_image.h): the image it writes for the
// default model's GGUF computes the GGUF's auto form bit for bit (int8 and bf16 activations,
// decode steps and many-row perplexity), its load copies almost nothing, another or a modified
// GGUF gets another file, a damaged file does not load and is written again, and a folder that
// cannot be written leaves the run on the GGUF. KESTREL_CACHE points at a temporary folder.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kestrel/formats/gguf.h"
#include "kestrel/image/auto_image.h"
#include "kestrel/image/image.h"
#include "kestrel/image/q8_tensors.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/image_cache.h"
#include "kestrel/runtime/perplexity.h"
#include "image_dir.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using runtime::ImageCacheStatus;

// "The capital of France is" with BOS, as llama.cpp tokenizes it.
const std::vector<runtime::TokenId> kPrompt = {2, 818, 5279, 529, 7001, 563};

class ImageCache : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::prepare_image_dir("image_cache_test", source_, dir_)) return;
    ::setenv("KESTREL_CACHE", (dir_ / "cache").c_str(), 1);
    ::unsetenv("KESTREL_IMAGE_CACHE");
    first_ = runtime::cached_image(source_, 2, [](const std::string& w) { ADD_FAILURE() << w; });
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void SetUp() override {
    if (source_.empty()) GTEST_SKIP() << "default model not installed";
  }
  static runtime::EngineOptions options(kernels::DecodeActivations a) {
    runtime::EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 64;
    o.load.precision = quant::Precision::kAuto;  // the GGUF's auto form (the CLI's default); the image as built
    o.load.decode_activations = a;
    return o;
  }
  // The prompt's last logits, then those of three greedy decode steps, one after another.
  static std::vector<float> logits(const fs::path& model, kernels::DecodeActivations a, size_t* copies = nullptr) {
    runtime::Engine engine(model, options(a));
    if (copies != nullptr) *copies = engine.model().info().load_copy_bytes;
    std::vector<float> all;
    std::span<float> l = engine.eval(kPrompt);
    for (int step = 0; step < 4; ++step) {
      all.insert(all.end(), l.begin(), l.end());
      const auto next = static_cast<runtime::TokenId>(std::max_element(l.begin(), l.end()) - l.begin());
      if (step < 3) l = engine.eval(std::vector<runtime::TokenId>{next});
    }
    return all;
  }
  static fs::path source_, dir_;
  static runtime::CachedImage first_;
};

fs::path ImageCache::source_, ImageCache::dir_;
runtime::CachedImage ImageCache::first_;

TEST_F(ImageCache, TheFirstCallWritesTheImageAndTheNextFindsIt) {
  EXPECT_EQ(first_.status, ImageCacheStatus::kWritten);
  EXPECT_EQ(first_.path, runtime::image_cache_path(source_));
  EXPECT_EQ(first_.path.parent_path(), dir_ / "cache" / "images");
  EXPECT_EQ(first_.bytes, fs::file_size(first_.path));
  const auto again = runtime::cached_image(source_, 2, [](const std::string& w) { ADD_FAILURE() << w; });
  EXPECT_EQ(again.status, ImageCacheStatus::kHit);
  EXPECT_EQ(again.path, first_.path);
  // Only the finished file is left in the folder: no temporary or partial one.
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(first_.path.parent_path())) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u);
}

TEST_F(ImageCache, TheImageHoldsTheKernelsLayouts) {
  const auto f = gguf::File::open(first_.path);
  const auto info = image::read_image_info(f);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(f.get_string(image::keys::kQuantMethod), image::kAutoQuantMethod);
  EXPECT_EQ(f.get_uint(image::keys::kAutoVersion), image::kAutoImageVersion);
  EXPECT_EQ(info->q8_int8_layout, image::kQ8Int8LayoutVersion);
  EXPECT_EQ(info->w4_int8_layout, image::kW4Int8LayoutVersion);
  // The default GGUF: Q5_0 attn_q, Q4_K attn_output, a Q8_0 embedding kept as its rows.
  EXPECT_TRUE(image::has_q8_layout(f, "blk.0.attn_q.weight"));
  EXPECT_NE(f.find_tensor("blk.0.attn_output.weight.q4i8"), nullptr);
  ASSERT_NE(f.find_tensor("token_embd.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("token_embd.weight")->type, gguf::TensorType::kQ8_0);
  EXPECT_TRUE(image::has_q8_layout(f, "token_embd.weight")) << "the tied head's interleaved layout too";
  EXPECT_NO_THROW(image::verify_content(f));
}

TEST_F(ImageCache, TheImageComputesTheGgufAutoFormBitForBit) {
  using A = kernels::DecodeActivations;
  for (const A a : {A::kAuto, A::kInt8, A::kBf16}) {
    size_t gguf_copies = 0, image_copies = 0;
    const auto from_gguf = logits(source_, a, &gguf_copies);
    const auto from_image = logits(first_.path, a, &image_copies);
    ASSERT_EQ(from_gguf.size(), from_image.size());
    EXPECT_TRUE(from_gguf == from_image) << "activations " << static_cast<int>(a);
    if (a != A::kBf16) {
      // The int8 path (AVX2 / AVX512-VNNI: what auto picks on x86) maps every layout in place.
      EXPECT_LT(image_copies, size_t{1} << 20) << "activations " << static_cast<int>(a);
      EXPECT_GT(gguf_copies, size_t{200} << 20);
    }
  }
}

TEST_F(ImageCache, ManyRowsOfTheHeadGiveTheSameLogitsToo) {
  // Perplexity scores every row of a chunk: the head's many-token products, from its rows as
  // stored in the image and from the interleaved copy of the GGUF's load.
  runtime::Engine gguf_engine(source_, options(kernels::DecodeActivations::kAuto));
  runtime::Engine image_engine(first_.path, options(kernels::DecodeActivations::kAuto));
  const auto tokens = gguf_engine.encode(
      "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Berlin is the capital of "
      "Germany. Rivers flow to the sea; mountains rise above the clouds, and the night sky is full of stars.",
      false);
  runtime::PerplexityOptions o;
  o.n_ctx = tokens.size() / 2;
  o.max_chunks = 1;
  const auto r = runtime::perplexity(image_engine, gguf_engine, tokens, o);
  EXPECT_EQ(r.ppl, r.base_ppl);
  EXPECT_EQ(r.kl_max, 0.0);
}

TEST_F(ImageCache, AModifiedOrAnotherGgufGetsAnotherFile) {
  const fs::path copy = dir_ / "copy.gguf";
  fs::copy_file(source_, copy, fs::copy_options::overwrite_existing);
  const fs::path a = runtime::image_cache_path(copy);
  EXPECT_NE(a, first_.path) << "another file name (the stem)";
  // The same bytes with another modification time.
  const auto mtime = fs::last_write_time(copy);
  fs::last_write_time(copy, mtime + std::chrono::seconds(5));
  const fs::path b = runtime::image_cache_path(copy);
  EXPECT_NE(a, b);
  // Another byte at the start (the header's first MiB is hashed) with the mtime put back.
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  fs::last_write_time(copy, mtime + std::chrono::seconds(5));
  EXPECT_NE(runtime::image_cache_path(copy), b);
  fs::remove(copy);
}

TEST_F(ImageCache, ADamagedFileDoesNotLoadAndIsWrittenAgain) {
  const fs::path path = runtime::image_cache_path(source_);
  ASSERT_TRUE(fs::exists(path));
  const auto size = fs::file_size(path);
  fs::resize_file(path, size / 2);
  EXPECT_THROW(runtime::Engine(path, options(kernels::DecodeActivations::kAuto)), Error);
  // The caller (the commands' load) then asks for it again, rebuilt.
  auto hit = runtime::cached_image(source_, 2, [](const std::string& w) { ADD_FAILURE() << w; });
  EXPECT_EQ(hit.status, ImageCacheStatus::kHit) << "found: whether it loads is the load's to say";
  const auto again = runtime::cached_image(source_, 2, [](const std::string& w) { ADD_FAILURE() << w; }, true);
  EXPECT_EQ(again.status, ImageCacheStatus::kWritten);
  EXPECT_EQ(fs::file_size(path), size);
  // A flipped byte in a tensor (half way: inside the 178 MB head): the content checksum refuses it.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size / 2));
    f.seekp(static_cast<std::streamoff>(size / 2));
    const int c = f.peek();
    f.put(static_cast<char>(c ^ 0x40));
  }
  EXPECT_THROW(runtime::Engine(path, options(kernels::DecodeActivations::kAuto)), Error);
  runtime::cached_image(source_, 2, [](const std::string&) {}, true);
  EXPECT_NO_THROW(runtime::Engine(path, options(kernels::DecodeActivations::kAuto)));
}

TEST_F(ImageCache, AFolderThatCannotBeWrittenLeavesTheGguf) {
  const fs::path blocker = dir_ / "not-a-folder";
  std::ofstream(blocker) << "x";
  ::setenv("KESTREL_CACHE", blocker.c_str(), 1);  // images/ cannot be made under a file
  std::vector<std::string> warnings;
  const auto c = runtime::cached_image(source_, 2, [&](const std::string& w) { warnings.push_back(w); });
  ::setenv("KESTREL_CACHE", (dir_ / "cache").c_str(), 1);
  EXPECT_EQ(c.status, ImageCacheStatus::kOff);
  EXPECT_EQ(c.path, source_);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("cannot write the GGUF image cache"), std::string::npos) << warnings[0];
}

TEST_F(ImageCache, AnImageIsNotCachedAndTheSwitchTurnsTheCacheOff) {
  const auto c = runtime::cached_image(first_.path, 2, [](const std::string& w) { ADD_FAILURE() << w; });
  EXPECT_EQ(c.status, ImageCacheStatus::kOff);
  EXPECT_TRUE(runtime::image_cache_enabled(false));
  EXPECT_FALSE(runtime::image_cache_enabled(true));
  ::setenv("KESTREL_IMAGE_CACHE", "0", 1);
  EXPECT_FALSE(runtime::image_cache_enabled(false));
  ::setenv("KESTREL_IMAGE_CACHE", "yes", 1);
  EXPECT_THROW(runtime::image_cache_enabled(false), Error);
  ::unsetenv("KESTREL_IMAGE_CACHE");
}

}  // namespace
}  // namespace kestrel
