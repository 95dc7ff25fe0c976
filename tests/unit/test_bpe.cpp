// The merge-rank BPE of Gemma 4's tokenizer (text/bpe.h) on hand-made merges whose results
// follow from the algorithm's definition (lowest rank first, leftmost among equal ranks).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/text/bpe.h"

namespace kestrel::text {
namespace {

TEST(BpeMerges, LowestRankFirstThenLeftmost) {
  const BpeMerges merges({"b c", "a b", "c d", "ab c"});
  const std::vector<std::string> vocab = {"a", "b", "c", "d", "bc", "ab", "cd", "abc"};
  auto find = [&](std::string_view p) -> std::optional<int32_t> {
    for (size_t i = 0; i < vocab.size(); ++i) {
      if (vocab[i] == p) return static_cast<int32_t>(i);
    }
    return std::nullopt;
  };
  auto byte = [](uint8_t b) { return 1000 + static_cast<int32_t>(b); };
  std::vector<int32_t> out;
  merges.encode("abcd", find, byte, out);  // "b c" (rank 0) first: a bc d; no further merge
  EXPECT_EQ(out, (std::vector<int32_t>{0, 4, 3}));
  out.clear();
  merges.encode("cdab", find, byte, out);  // c d -> cd, a b -> ab
  EXPECT_EQ(out, (std::vector<int32_t>{6, 5}));
  out.clear();
  merges.encode("ax", find, byte, out);  // x is not in the vocabulary: its byte
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1000 + 'x'}));
  EXPECT_THROW(BpeMerges({"nospace"}), Error);
  EXPECT_EQ(split_newline_runs("a b\n\ncd\n"), (std::vector<std::string_view>{"a b", "\n\n", "cd", "\n"}));
}

}  // namespace
}  // namespace kestrel::text
