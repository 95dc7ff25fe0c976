// `kestrel build DIR` on a Hugging Face Gemma 3 checkpoint: the checkpoint is written from the
// default GGUF's dequantized weights by scripts/goldens/make_hf_checkpoint.py (undoing
// llama.cpp's transformations), so the image built from it must equal, tensor for tensor and
// bit for bit, the image built from the GGUF, and compute the same logits. Skipped when the
// default model or the script's Python dependencies (numpy, gguf) are missing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/formats/safetensors.h"
#include "kestrel/image/builder.h"
#include "kestrel/image/hf_gemma3.h"
#include "kestrel/image/image.h"
#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/model_path.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;

const std::vector<runtime::TokenId> kPrompt = {2, 818, 5279, 529, 7001, 563};

class HfCheckpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    try {
      source_ = runtime::default_model_path();
    } catch (const std::exception&) {
      skip_ = "default model not installed";
      return;
    }
    dir_ = fs::temp_directory_path() / ("kestrel_hf_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const fs::path script = fs::path(__FILE__).parent_path().parent_path().parent_path() /
                            "scripts/goldens/make_hf_checkpoint.py";
    // One file with the "model." prefix; two shards with the multimodal "model.language_model." one.
    const std::string common = "python3 '" + script.string() + "' --gguf '" + source_.string() + "' ";
    if (std::system((common + "'" + (dir_ / "hf").string() + "'").c_str()) != 0 ||
        std::system((common + "--shards 2 --prefix model.language_model. '" + (dir_ / "hf2").string() + "'").c_str()) != 0) {
      skip_ = "make_hf_checkpoint.py failed (python3 with numpy and gguf needed)";
      return;
    }
    ThreadPool pool(0);
    image::BuildOptions bf16;
    bf16.precision = quant::Precision::kBF16;
    image::build_image(source_, dir_ / "gguf_bf16.kimg", bf16, pool);
    image::build_image_from_hf(dir_ / "hf", dir_ / "hf_bf16.kimg", bf16, pool);
    image::build_image_from_hf(dir_ / "hf2", dir_ / "hf2_bf16.kimg", bf16, pool);
    // w4a16 keeps the embedding in the source's type (Q8_0 in the GGUF, F32 in the checkpoint);
    // as INT4 it is quantized from the same values either way.
    image::BuildOptions w4;
    w4.embedding = image::BuildOptions::Embedding::kInt4;
    image::build_image(source_, dir_ / "gguf_w4.kimg", w4, pool);
    image::build_image_from_hf(dir_ / "hf", dir_ / "hf_w4.kimg", w4, pool);
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
  }
  static std::vector<float> logits(const fs::path& path) {
    runtime::Engine engine(path, {2, 64, {quant::Precision::kSource, 32, true}});
    const auto l = engine.eval(kPrompt);
    return {l.begin(), l.end()};
  }
  static void expect_same_tensors(const fs::path& a_path, const fs::path& b_path) {
    const auto a = gguf::File::open(a_path);
    const auto b = gguf::File::open(b_path);
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    for (size_t i = 0; i < a.tensors().size(); ++i) {
      const auto& ta = a.tensors()[i];
      const auto& tb = b.tensors()[i];
      ASSERT_EQ(ta.name, tb.name);
      ASSERT_EQ(ta.type, tb.type) << ta.name;
      ASSERT_EQ(ta.shape, tb.shape) << ta.name;
      const auto da = a.tensor_data(ta);
      const auto db = b.tensor_data(tb);
      ASSERT_EQ(da.size(), db.size()) << ta.name;
      EXPECT_EQ(std::memcmp(da.data(), db.data(), da.size()), 0) << ta.name << " differs";
    }
    // The content hashes differ (they cover metadata: source file, build date, tokenizer
    // scores), but each image verifies against its own.
    EXPECT_NO_THROW(image::verify_content(a));
    EXPECT_NO_THROW(image::verify_content(b));
  }
  static fs::path source_, dir_;
  static std::string skip_;
};

fs::path HfCheckpoint::source_, HfCheckpoint::dir_;
std::string HfCheckpoint::skip_;

TEST_F(HfCheckpoint, Bf16ImageEqualsTheGgufBuildBitForBit) {
  expect_same_tensors(dir_ / "hf_bf16.kimg", dir_ / "gguf_bf16.kimg");
}

TEST_F(HfCheckpoint, ShardedCheckpointGivesTheSameImage) {
  EXPECT_TRUE(fs::exists(dir_ / "hf2" / "model.safetensors.index.json"));
  const auto ckpt = safetensors::Checkpoint::open(dir_ / "hf2");
  EXPECT_EQ(ckpt.files().size(), 2u);
  EXPECT_TRUE(ckpt.has("model.language_model.embed_tokens.weight"));
  expect_same_tensors(dir_ / "hf2_bf16.kimg", dir_ / "gguf_bf16.kimg");
}

TEST_F(HfCheckpoint, W4A16ImageEqualsTheGgufBuildBitForBit) {
  expect_same_tensors(dir_ / "hf_w4.kimg", dir_ / "gguf_w4.kimg");
}

TEST_F(HfCheckpoint, SameLogitsAndTokenizationAsTheGgufBuild) {
  EXPECT_EQ(logits(dir_ / "hf_bf16.kimg"), logits(dir_ / "gguf_bf16.kimg"));
  EXPECT_EQ(logits(dir_ / "hf2_bf16.kimg"), logits(dir_ / "gguf_bf16.kimg"));
  runtime::Engine a(dir_ / "hf_bf16.kimg", {1, 64, {}});
  runtime::Engine b(dir_ / "gguf_bf16.kimg", {1, 64, {}});
  for (const char* text : {"The capital of France is", "Hello, world! <start_of_turn>user\nÉtat 123 😀 \t  x",
                           "def f(x):\n    return x ** 2  # ünïcödé"}) {
    EXPECT_EQ(a.tokenizer().encode(text, true, true), b.tokenizer().encode(text, true, true)) << text;
  }
}

TEST_F(HfCheckpoint, HyperparametersAndTokenizerKeysMatchTheGguf) {
  const auto hf = gguf::File::open(dir_ / "hf_bf16.kimg");
  const auto gg = gguf::File::open(source_);
  for (const auto& [key, value] : gg.metadata()) {
    if (key.rfind("gemma3.", 0) == 0 || key == "general.architecture") {
      ASSERT_TRUE(hf.has(key)) << key;
      if (value.type == gguf::ValueType::kFloat32) EXPECT_EQ(hf.get_float(key), gg.get_float(key)) << key;
      else if (value.type == gguf::ValueType::kString) EXPECT_EQ(hf.get_string(key), gg.get_string(key)) << key;
      else EXPECT_EQ(hf.get_uint(key), gg.get_uint(key)) << key;
    }
  }
  EXPECT_EQ(hf.get_string_array("tokenizer.ggml.tokens"), gg.get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(hf.get_int_array("tokenizer.ggml.token_type"), gg.get_int_array("tokenizer.ggml.token_type"));
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"}) {
    EXPECT_EQ(hf.get_uint(key), gg.get_uint(key)) << key;
  }
  EXPECT_EQ(hf.get_bool("tokenizer.ggml.add_bos_token"), gg.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(hf.get_bool("tokenizer.ggml.add_space_prefix"), false);
  EXPECT_EQ(hf.get_uint("gemma3.attention.sliding_window_pattern"), 6u);
  EXPECT_EQ(hf.get_float("gemma3.rope.freq_base_swa"), 10000.0);
  EXPECT_NE(hf.get_string(image::keys::kLicenseText).find("NOTICE.md"), std::string::npos);
}

TEST_F(HfCheckpoint, MissingTokenizerIsAClearError) {
  const fs::path broken = dir_ / "broken";
  fs::create_directories(broken);
  fs::copy_file(dir_ / "hf" / "config.json", broken / "config.json");
  fs::create_symlink(dir_ / "hf" / "model.safetensors", broken / "model.safetensors");
  try {
    image::write_hf_gemma3_gguf(broken, dir_ / "broken.gguf");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kestrel
