// head::token_logits (a few tokens' logits, for rescoring) must give exactly the value
// head::dense_logits gives that token, whatever kernel the head runs on: the float32 Q8_0 path,
// and the int8-activation copy (gemv_q8_interleaved) that a head takes where int8 is chosen.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/head/output_head.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/runtime/logprobs.h"
#include "random_q8.h"

namespace {

namespace k = kestrel::kernels;

using kestrel::testing::q8_0_view;
using kestrel::testing::random_q8_0;

TEST(OutputHead, TokenLogitsEqualTheDenseLogitsOnEveryKernel) {
  const size_t vocab = 77, d = 96;  // rows past a multiple of 16: a padded interleaved block
  const auto bytes = random_q8_0(vocab, d, 3);
  const k::Matrix w = q8_0_view(bytes, vocab, d);
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

// Prompt scoring reads the dense logits in the head's row order (a FlashHead image stores the
// head by cluster) and takes each position's log-softmax there: the same logits bit for bit as
// dense_logits' token order, and the same log-probabilities (the sum of exponentials in another
// order: equal within its rounding) and top tokens.
TEST(OutputHead, RowOrderLogitsAndLogprobsEqualTheTokenOrdersOnEveryKernel) {
  const size_t vocab = 96, d = 64, n_rows = 20;  // 10 rows a thread: the rows kernel's interleaving path too
  const auto bytes = random_q8_0(vocab, d, 9);
  const k::Matrix w = q8_0_view(bytes, vocab, d);
  std::vector<kestrel::head::TokenId> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(13));
  std::mt19937_64 rng(7);
  std::normal_distribution<float> g;
  std::vector<float> hidden(n_rows * d);
  for (auto& v : hidden) v = 3.0f * g(rng);
  kestrel::ThreadPool pool(2);
  for (bool int8_rows : {false, true}) {
    SCOPED_TRACE(int8_rows ? "int8 rows" : "float32 path");
    kestrel::head::OutputHead head;
    head.weight = w;
    head.weight.int8_rows = int8_rows;
    head.final_softcap = 30.0f;
    head.set_row_order(order);
    std::vector<float> by_token(n_rows * vocab), by_row(n_rows * vocab);
    kestrel::head::dense_logits(head, hidden.data(), n_rows, by_token.data(), pool);
    kestrel::head::dense_logits_row_order(head, hidden.data(), n_rows, by_row.data(), pool);
    for (size_t t = 0; t < n_rows; ++t) {
      for (size_t r = 0; r < vocab; ++r) {
        ASSERT_EQ(by_row[t * vocab + r], by_token[t * vocab + static_cast<size_t>(order[r])]) << "t=" << t << " r=" << r;
      }
      const auto chosen = static_cast<kestrel::head::TokenId>((7 * t + 3) % vocab);
      const auto a = kestrel::runtime::compute_logprobs({&by_token[t * vocab], vocab}, chosen, 3);
      const auto b = kestrel::runtime::compute_logprobs_at({&by_row[t * vocab], vocab}, head.row_tokens,
                                                           head.row_of(chosen), 3);
      EXPECT_EQ(b.chosen.token, chosen);
      EXPECT_NEAR(b.chosen.logprob, a.chosen.logprob, 1e-6f * std::max(1.0f, std::fabs(a.chosen.logprob)));
      ASSERT_EQ(b.top.size(), a.top.size());
      for (size_t i = 0; i < a.top.size(); ++i) EXPECT_EQ(b.top[i].token, a.top[i].token) << "t=" << t;
    }
  }
}

}  // namespace
