// Gemma 4's per-layer token table read one row at a time, from a plain GGUF (BF16) and from a
// Kestrel W4A16 image that holds it as INT4 (codes, fp16 scales and optional minimums), against
// values written down independently of the kernels.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gguf_writer.h"
#include "kestrel/base/error.h"
#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/image/image.h"
#include "kestrel/model/ple.h"
#include "kestrel/model/weights.h"

namespace {

using kestrel::gguf::TensorType;
using kestrel::gguf::ValueType;
using kestrel::gguf::testing::Bytes;
using kestrel::gguf::testing::GgufWriter;

constexpr size_t kVocab = 5, kRowLen = 64, kGroup = 32;
const std::string kName = "per_layer_token_embd.weight";

// Test values, all exact in fp16 and float32.
uint8_t code(size_t token, size_t i) { return static_cast<uint8_t>((token * 7 + i * 3) % 16); }
float scale(size_t token, size_t g) { return 0.25f * static_cast<float>(token + 1) + 0.5f * static_cast<float>(g); }
float minimum(size_t token, size_t g) { return -1.0f - static_cast<float>(token) - 0.125f * static_cast<float>(g); }

// An image with the table as INT4; zero_points: affine groups (w = d * q + m), else symmetric
// (w = d * (q - 8)).
std::vector<std::byte> int4_image(bool zero_points) {
  Bytes codes, scales, mins;
  for (size_t t = 0; t < kVocab; ++t) {
    for (size_t g = 0; g < kRowLen / kGroup; ++g) {
      // Within a group of 32, byte j holds value j in its low nibble and value j + 16 in its high.
      for (size_t j = 0; j < kGroup / 2; ++j) {
        const size_t i = g * kGroup + j;
        codes.u8(static_cast<uint8_t>(code(t, i) | (code(t, i + kGroup / 2) << 4)));
      }
      scales.u16(kestrel::gguf::fp32_to_fp16(scale(t, g)));
      mins.u16(kestrel::gguf::fp32_to_fp16(minimum(t, g)));
    }
  }
  GgufWriter w;
  w.kv(kestrel::image::keys::kFormatVersion, ValueType::kUint32, Bytes().u32(kestrel::image::kFormatVersion));
  w.kv(kestrel::image::keys::kPrecision, ValueType::kString, Bytes().str("w4a16"));
  w.kv(kestrel::image::keys::kGroupSize, ValueType::kUint32, Bytes().u32(kGroup));
  w.kv(kestrel::image::keys::kZeroPoints, ValueType::kUint32, Bytes().u32(zero_points ? 1 : 0));
  w.tensor(kName + kestrel::image::kQ4Suffix, TensorType::kI8, {kRowLen / 2, kVocab}, codes);
  w.tensor(kName + kestrel::image::kScalesSuffix, TensorType::kF16, {kRowLen / kGroup, kVocab}, scales);
  if (zero_points) w.tensor(kName + kestrel::image::kMinsSuffix, TensorType::kF16, {kRowLen / kGroup, kVocab}, mins);
  return w.build();
}

}  // namespace

TEST(PerLayerTable, Int4ImageRowsAreDequantizedOneAtATime) {
  kestrel::ThreadPool pool(1);
  for (bool zero_points : {true, false}) {
    const auto bytes = int4_image(zero_points);
    const auto file = kestrel::gguf::File::parse(bytes);
    kestrel::model::WeightStore store(file, {}, pool);
    const kestrel::model::PerLayerTable table(file, store, kVocab, kRowLen);
    ASSERT_EQ(table.row_len(), kRowLen);
    std::vector<float> row(kRowLen);
    for (size_t t : {size_t{3}, size_t{0}, size_t{4}, size_t{1}}) {
      table.row(t, row.data());
      for (size_t i = 0; i < kRowLen; ++i) {
        const size_t g = i / kGroup;
        const float q = static_cast<float>(code(t, i));
        const float expected = zero_points ? scale(t, g) * q + minimum(t, g) : scale(t, g) * (q - 8.0f);
        ASSERT_EQ(row[i], expected) << "token " << t << " value " << i << " zero points " << zero_points;
      }
    }
  }
}

TEST(PerLayerTable, Bf16TableRowsAreReadInPlace) {
  kestrel::ThreadPool pool(1);
  Bytes data;
  for (size_t t = 0; t < kVocab; ++t) {
    for (size_t i = 0; i < kRowLen; ++i) data.u16(kestrel::gguf::fp32_to_bf16(0.5f * static_cast<float>(t) - 0.25f * static_cast<float>(i)));
  }
  GgufWriter w;
  w.tensor(kName, TensorType::kBF16, {kRowLen, kVocab}, data);
  const auto bytes = w.build();
  const auto file = kestrel::gguf::File::parse(bytes);
  kestrel::model::WeightStore store(file, {}, pool);
  const kestrel::model::PerLayerTable table(file, store, kVocab, kRowLen);
  std::vector<float> row(kRowLen);
  table.row(2, row.data());
  for (size_t i = 0; i < kRowLen; ++i) EXPECT_EQ(row[i], 1.0f - 0.25f * static_cast<float>(i));
  // A table of another shape is refused with a clear error.
  EXPECT_THROW(kestrel::model::PerLayerTable(file, store, kVocab + 1, kRowLen), kestrel::Error);
}
