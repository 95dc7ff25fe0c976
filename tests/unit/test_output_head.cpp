// head::token_logits (a few tokens' logits, for rescoring) must give exactly the value
// head::dense_logits gives that token, whatever kernel the head runs on: the float32 Q8_0 path,
// and the int8-activation copy (gemv_q8_interleaved) that a head takes where int8 is chosen.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/head/output_head.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "random_q8.h"

namespace {

namespace k = kestrel::kernels;

using kestrel::testing::random_q8_0;

TEST(OutputHead, TokenLogitsEqualTheDenseLogitsOnEveryKernel) {
  const size_t vocab = 77, d = 96;  // rows past a multiple of 16: a padded interleaved block
  const auto bytes = random_q8_0(vocab, d, 3);
  k::Matrix w;
  w.type = k::WeightType::kQ8_0;
  w.data = bytes.data();
  w.rows = vocab;
  w.cols = d;
  const k::Q8Interleaved il = k::interleave_q8_0(w);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> g;
  std::vector<float> hidden(d);
  for (auto& v : hidden) v = 3.0f * g(rng);
  const std::vector<kestrel::head::TokenId> tokens = {0, 5, 16, 17, 63, 76, 40};
  kestrel::ThreadPool pool(2);
  for (bool int8 : {false, true}) {
    SCOPED_TRACE(int8 ? "int8 copy" : "float32 path");
    kestrel::head::OutputHead head;
    head.weight = w;
    head.weight.interleaved_q8 = int8 ? &il : nullptr;
    head.final_softcap = 30.0f;
    std::vector<float> dense(vocab), some(tokens.size());
    kestrel::head::dense_logits(head, hidden.data(), 1, dense.data(), pool);
    kestrel::head::token_logits(head, hidden.data(), tokens, some.data(), pool);
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(some[i], dense[static_cast<size_t>(tokens[i])]) << "token " << tokens[i];
    }
  }
}

}  // namespace
