// The safetensors reader on crafted files: every malformed input is a kestrel::Error whose
// message names the problem (and the tensor), never a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/safetensors.h"

namespace kestrel::safetensors {
namespace {

namespace fs = std::filesystem;

std::vector<std::byte> file_bytes(const std::string& header, size_t data_bytes, int64_t length_override = -1) {
  std::vector<std::byte> out(8 + header.size() + data_bytes, std::byte{0});
  uint64_t n = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = static_cast<std::byte>(i);
  return out;
}

std::string error_of(const std::vector<std::byte>& bytes) {
  try {
    File::parse(bytes, "test.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(bytes, ...)                                                   \
  do {                                                                             \
    const std::string msg = error_of(bytes);                                       \
    ASSERT_FALSE(msg.empty()) << "accepted";                                       \
    EXPECT_NE(msg.find("test.safetensors"), std::string::npos) << msg;             \
    for (const char* part : {__VA_ARGS__}) EXPECT_NE(msg.find(part), std::string::npos) << msg; \
  } while (0)

TEST(Safetensors, ParsesAWellFormedFile) {
  const std::string h =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"F16","shape":[0,3],"data_offsets":[12,12]}})";
  const auto bytes = file_bytes(h, 12);
  const File f = File::parse(bytes, "test.safetensors");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "a");  // data order
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const auto* b = f.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, Dtype::kBF16);
  EXPECT_EQ(f.data(*b).size(), 4u);
  EXPECT_EQ(f.data(*b)[0], std::byte{8});
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, TooShortForTheLength) { EXPECT_ERROR(std::vector<std::byte>(5), "too short"); }

TEST(Safetensors, HeaderLengthPastTheEnd) {
  EXPECT_ERROR(file_bytes(R"({})", 0, 1000), "header length 1000", "truncated");
}

TEST(Safetensors, HugeHeaderLength) { EXPECT_ERROR(file_bytes(R"({})", 0, int64_t{1} << 40), "exceeds"); }

TEST(Safetensors, BadJson) { EXPECT_ERROR(file_bytes(R"({"a":{"dtype":)", 0), "not valid JSON"); }

TEST(Safetensors, HeaderNotAnObject) { EXPECT_ERROR(file_bytes(R"([1,2])", 0), "not a JSON object"); }

TEST(Safetensors, UnknownDtype) {
  EXPECT_ERROR(file_bytes(R"({"w":{"dtype":"F8_E9","shape":[1],"data_offsets":[0,1]}})", 1), "tensor 'w'", "unknown dtype 'F8_E9'");
}

TEST(Safetensors, MissingField) {
  EXPECT_ERROR(file_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", 4), "tensor 'w'", "data_offsets");
}

TEST(Safetensors, OffsetsPastTheData) {
  EXPECT_ERROR(file_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "tensor 'w'", "run past the data area");
}

TEST(Safetensors, TruncatedFile) {
  auto bytes = file_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 16);
  bytes.resize(bytes.size() - 3);
  EXPECT_ERROR(bytes, "tensor 'w'", "truncated");
}

TEST(Safetensors, EndBeforeBegin) {
  EXPECT_ERROR(file_bytes(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", 8), "tensor 'w'", "< begin");
}

TEST(Safetensors, ShapeSizeMismatch) {
  EXPECT_ERROR(file_bytes(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24), "tensor 'w'", "shape [2, 3]", "needs 24 bytes", "give 20");
}

TEST(Safetensors, ShapeOverflow) {
  EXPECT_ERROR(file_bytes(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", 4), "tensor 'w'", "2^64");
}

TEST(Safetensors, NegativeExtent) {
  EXPECT_ERROR(file_bytes(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "tensor 'w'", "shape extent");
}

TEST(Safetensors, Overlap) {
  EXPECT_ERROR(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
               "'a'", "'b'", "overlap");
}

TEST(Safetensors, DuplicateName) {
  EXPECT_ERROR(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               "tensor 'a'", "twice");
}

TEST(Safetensors, BadMetadata) {
  EXPECT_ERROR(file_bytes(R"({"__metadata__":{"k":1}})", 0), "__metadata__");
}

class CheckpointDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kestrel_st_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name, std::ios::binary) << text; }
  void write(const std::string& name, const std::vector<std::byte>& bytes) {
    std::ofstream(dir_ / name, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::string error() {
    try {
      Checkpoint::open(dir_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(CheckpointDir, OpensShardsThroughTheIndex) {
  write("config.json", R"({"model_type":"gemma3_text"})");
  write("a.safetensors", file_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4));
  write("b.safetensors", file_bytes(R"({"y":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8));
  write("model.safetensors.index.json", R"({"weight_map":{"x":"a.safetensors","y":"b.safetensors"}})");
  const auto c = Checkpoint::open(dir_);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(c.info("y").shape, std::vector<uint64_t>{2});
  EXPECT_EQ(c.data("y").size(), 8u);
  EXPECT_EQ(c.config()["model_type"], "gemma3_text");
  EXPECT_THROW(c.info("z"), Error);
}

TEST_F(CheckpointDir, NoConfig) { EXPECT_NE(error().find("config.json"), std::string::npos); }

TEST_F(CheckpointDir, NoWeights) {
  write("config.json", "{}");
  EXPECT_NE(error().find("no *.safetensors"), std::string::npos);
}

TEST_F(CheckpointDir, BadConfigJson) {
  write("config.json", "{nope");
  EXPECT_NE(error().find("not valid JSON"), std::string::npos);
}

TEST_F(CheckpointDir, IndexNamesAMissingShard) {
  write("config.json", "{}");
  write("model.safetensors.index.json", R"({"weight_map":{"x":"gone.safetensors"}})");
  EXPECT_NE(error().find("gone.safetensors"), std::string::npos);
}

TEST_F(CheckpointDir, IndexNamesATensorTheShardLacks) {
  write("config.json", "{}");
  write("a.safetensors", file_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4));
  write("model.safetensors.index.json", R"({"weight_map":{"x":"a.safetensors","y":"a.safetensors"}})");
  EXPECT_NE(error().find("'y'"), std::string::npos);
}

TEST_F(CheckpointDir, IndexEscapingTheDirectoryIsRefused) {
  write("config.json", "{}");
  write("model.safetensors.index.json", R"({"weight_map":{"x":"../etc/passwd"}})");
  EXPECT_NE(error().find("not a file in the directory"), std::string::npos);
}

}  // namespace
}  // namespace kestrel::safetensors
