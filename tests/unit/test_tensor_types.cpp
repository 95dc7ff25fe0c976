// --tensor-type PATTERN=TYPE: parsing and the matching rule (image/tensor_types.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/image/tensor_types.h"

namespace kestrel::image {
namespace {

std::string error_of(const std::string& spec) {
  try {
    parse_tensor_type(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorTypes, ParsesPatternAndType) {
  const auto a = parse_tensor_type("attn_v=q8_0");
  EXPECT_EQ(a.pattern, "attn_v");
  EXPECT_EQ(a.storage, MatrixStorage::kQ8_0);
  EXPECT_EQ(parse_tensor_type("blk.3.ffn_down.weight=bf16").storage, MatrixStorage::kBF16);
  EXPECT_EQ(parse_tensor_type("blk.3.ffn_down.weight=bf16").pattern, "blk.3.ffn_down.weight");
  EXPECT_EQ(parse_tensor_type("blk.0=w4").storage, MatrixStorage::kInt4);
}

TEST(TensorTypes, RefusesMalformedSpecsWithTheReason) {
  EXPECT_NE(error_of("attn_v").find("expected PATTERN=TYPE"), std::string::npos);
  EXPECT_NE(error_of("=q8_0").find("pattern before '=' is empty"), std::string::npos);
  EXPECT_NE(error_of("attn_v=q4_k").find("unknown type 'q4_k' (w4, q8_0 or bf16)"), std::string::npos);
  EXPECT_NE(error_of("attn_v=").find("unknown type ''"), std::string::npos);
  EXPECT_NE(error_of("attn_v.=q8_0").find("ends with '.'"), std::string::npos);
  for (const char* bad : {".attn_v=q8_0", "blk..3=q8_0", "attn v=q8_0", "attn_v*=q8_0", "a=b=q8_0"}) {
    EXPECT_NE(error_of(bad).find("dot-separated name components"), std::string::npos) << bad;
  }
}

TEST(TensorTypes, PatternsMatchWholeComponents) {
  const std::string name = "blk.3.ffn_down.weight";
  for (const char* p : {"ffn_down", "blk", "blk.3", "3", "3.ffn_down", "blk.3.ffn_down", "blk.3.ffn_down.weight", "weight"}) {
    EXPECT_TRUE(pattern_matches(p, name)) << p;
  }
  for (const char* p : {"ffn", "down", "blk.3.ffn", "blk.31", "lk.3", "ffn_down.bias", "blk.13.ffn_down", "", "blk.3.ffn_down.weight.q4"}) {
    EXPECT_FALSE(pattern_matches(p, name)) << p;
  }
  EXPECT_FALSE(pattern_matches("blk.1", "blk.13.attn_q.weight"));
  EXPECT_TRUE(pattern_matches("blk.13", "blk.13.attn_q.weight"));
}

TEST(TensorTypes, TheLastMatchingOverrideWins) {
  const std::vector<TensorTypeOverride> o = {
      parse_tensor_type("ffn_down=q8_0"), parse_tensor_type("blk.0.ffn_down=w4"), parse_tensor_type("blk.1=bf16")};
  EXPECT_EQ(storage_of("blk.0.ffn_down.weight", o), MatrixStorage::kInt4);
  EXPECT_EQ(storage_of("blk.2.ffn_down.weight", o), MatrixStorage::kQ8_0);
  EXPECT_EQ(storage_of("blk.1.ffn_down.weight", o), MatrixStorage::kBF16);
  EXPECT_EQ(storage_of("blk.1.attn_q.weight", o), MatrixStorage::kBF16);
  EXPECT_EQ(storage_of("blk.2.attn_q.weight", o), MatrixStorage::kInt4);
  EXPECT_EQ(overrides_string(o), "ffn_down=q8_0,blk.0.ffn_down=w4,blk.1=bf16");
  EXPECT_EQ(overrides_string({}), "");
}

}  // namespace
}  // namespace kestrel::image
