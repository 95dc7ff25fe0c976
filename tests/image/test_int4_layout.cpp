// Images of the default model built with their INT4 layer matrices in the int8 layout (the
// default) and plain (--int4-layout plain), with affine, symmetric and 8-bit group parameters:
// the same logits on the int8 path (the layout read in place) and the bf16 path (de-interleaved
// at load), the same export, and fewer load copies.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kestrel/formats/gguf.h"
#include "kestrel/image/builder.h"
#include "kestrel/image/hf_export.h"
#include "kestrel/image/image.h"
#include "kestrel/image/int4_tensors.h"
#include "kestrel/kernels/gemv_w4_int8.h"
#include "kestrel/runtime/engine.h"
#include "image_dir.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;

// "The capital of France is" with BOS, as llama.cpp tokenizes it.
const std::vector<runtime::TokenId> kPrompt = {2, 818, 5279, 529, 7001, 563};

// Group parameters: affine fp16 d and m, symmetric fp16 d, affine 8-bit (--scale-bits 8).
enum class Kind { kAffine, kSymmetric, kScales8 };
constexpr Kind kKinds[] = {Kind::kAffine, Kind::kSymmetric, Kind::kScales8};
std::string name(Kind k) { return k == Kind::kAffine ? "affine" : k == Kind::kSymmetric ? "sym" : "s8"; }

class Int4Layout : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!testing::prepare_image_dir("int4_layout_test", source_, dir_)) return;
    ThreadPool pool(0);
    for (const Kind kind : kKinds) {
      for (const bool int8 : {true, false}) {
        image::BuildOptions o;
        o.zero_points = kind != Kind::kSymmetric;
        o.scale_bits = kind == Kind::kScales8 ? 8 : 16;
        o.int8_layout = int8;
        image::build_image(source_, path(kind, int8), o, pool);
      }
    }
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void SetUp() override {
    if (source_.empty()) GTEST_SKIP() << "default model not installed";
  }
  static fs::path path(Kind kind, bool int8) { return dir_ / (name(kind) + (int8 ? "-int8.kimg" : "-plain.kimg")); }
  static std::vector<float> logits(const fs::path& image, kernels::DecodeActivations a, size_t* copies = nullptr) {
    runtime::EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 64;
    o.load.decode_activations = a;
    runtime::Engine engine(image, o);
    if (copies != nullptr) *copies = engine.model().info().load_copy_bytes;
    const auto l = engine.eval(kPrompt);
    return {l.begin(), l.end()};
  }
  static fs::path source_, dir_;
};

fs::path Int4Layout::source_, Int4Layout::dir_;

// Bytes of the image's tensors in the int8 layout.
size_t int8_layout_bytes(const fs::path& image) {
  const auto f = gguf::File::open(image);
  size_t n = 0;
  for (const auto& t : f.tensors()) {
    const bool codes = !image::int4_base(t.name).empty() && t.name.ends_with(image::kInt8CodesSuffix);
    const bool params = t.name.find(std::string(image::kInt8CodesSuffix) + "_") != std::string::npos;
    if (codes || params) n += t.n_bytes;
  }
  return n;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_F(Int4Layout, TheDefaultBuildStoresTheLayerMatricesInTheInt8Layout) {
  for (const Kind kind : kKinds) {
    SCOPED_TRACE(name(kind));
    const auto f = gguf::File::open(path(kind, true));
    const auto info = image::read_image_info(f);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->w4_int8_layout, image::kW4Int8LayoutVersion);
    EXPECT_TRUE(image::has_int8_layout(f, "blk.0.attn_q.weight"));
    EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight.q4"), nullptr);
    EXPECT_NE(f.find_tensor("blk.0.ffn_down.weight.q4i8_mins"), nullptr) << "symmetric groups too: m = -8 d";
    EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight.q4i8_rows") != nullptr, kind == Kind::kScales8);
    const auto plain = gguf::File::open(path(kind, false));
    EXPECT_EQ(image::read_image_info(plain)->w4_int8_layout, 0u);
    EXPECT_FALSE(image::has_int8_layout(plain, "blk.0.attn_q.weight"));
    EXPECT_NE(plain.find_tensor("blk.0.attn_q.weight.q4"), nullptr);
  }
}

TEST_F(Int4Layout, BothLayoutsComputeTheSameLogitsOnTheInt8AndTheBf16Path) {
  using A = kernels::DecodeActivations;
  for (const Kind kind : kKinds) {
    for (const A a : {A::kAuto, A::kInt8, A::kBf16}) {
      const auto int8 = logits(path(kind, true), a);
      const auto plain = logits(path(kind, false), a);
      ASSERT_EQ(int8.size(), plain.size());
      EXPECT_EQ(int8, plain) << name(kind) << ", activations " << static_cast<int>(a);
    }
  }
}

TEST_F(Int4Layout, TheInt8PathCopiesNothingOfTheLayout) {
  for (const Kind kind : kKinds) {
    size_t int8 = 0, plain = 0;
    logits(path(kind, true), kernels::DecodeActivations::kInt8, &int8);
    logits(path(kind, false), kernels::DecodeActivations::kInt8, &plain);
    // The plain image's int8 copies hold exactly what the new image stores: the codes, the group
    // parameters (16-bit: d and m, symmetric groups included) and 8-bit's float32 row scales.
    EXPECT_EQ(plain - int8, int8_layout_bytes(path(kind, true))) << name(kind);
    // The bf16 path re-lays the int8 layout out at load: copies, counted.
    size_t relaid = 0, plain_bf16 = 0;
    logits(path(kind, true), kernels::DecodeActivations::kBf16, &relaid);
    logits(path(kind, false), kernels::DecodeActivations::kBf16, &plain_bf16);
    EXPECT_GT(relaid, plain_bf16) << name(kind);
  }
}

TEST_F(Int4Layout, ExportWritesTheSameCheckpointFromEitherLayout) {
  ThreadPool pool(2);
  for (const Kind kind : {Kind::kSymmetric, Kind::kAffine}) {
    const bool symmetric = kind == Kind::kSymmetric;
    image::HfExportOptions o;
    o.requantize = !symmetric;  // float minimums: requantized from the weights, the same either way
    const fs::path a = dir_ / "export-int8", b = dir_ / "export-plain";
    const auto ra = image::export_hf(path(kind, true), a, o, pool);
    const auto rb = image::export_hf(path(kind, false), b, o, pool);
    EXPECT_EQ(ra.int4_matrices, rb.int4_matrices);
    EXPECT_GT(ra.int4_matrices, 0u);
    EXPECT_EQ(ra.requantized_groups, rb.requantized_groups);
    EXPECT_TRUE(file_bytes(a / "model.safetensors") == file_bytes(b / "model.safetensors"))
        << (symmetric ? "symmetric" : "affine");
    EXPECT_EQ(file_bytes(a / "config.json"), file_bytes(b / "config.json"));
    fs::remove_all(a);
    fs::remove_all(b);
  }
}

}  // namespace
}  // namespace kestrel
