// The bfloat16 prefill attention tile (kernels/attention_bf16.h) against a float64 reference
// of the same rounding (Q, K, V and the softmax weights to bfloat16, all else exact), and its
// promise that a query's output does not depend on the tile around it. Skipped where the CPU
// has no AVX512-BF16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/attention_bf16.h"
#include "kestrel/kernels/ops.h"
#include "random_vector.h"

namespace k = kestrel::kernels;
namespace gguf = kestrel::gguf;

namespace {

using kestrel::testing::random_vector;

double bf16(float x) { return gguf::bf16_to_fp32(gguf::fp32_to_bf16(x)); }

// An fp16 ring cache of one KV head (row stride wider than the head, as with several heads).
struct Ring {
  size_t capacity, stride, hd;
  std::vector<uint16_t> k, v;
  Ring(size_t capacity_, size_t hd_) : capacity(capacity_), stride(2 * hd_), hd(hd_) {
    const auto kf = random_vector(capacity * stride, 21, 0.5f), vf = random_vector(capacity * stride, 22);
    k.resize(kf.size());
    v.resize(vf.size());
    k::to_fp16(kf.data(), k.data(), k.size());
    k::to_fp16(vf.data(), v.data(), v.size());
  }
  float kval(size_t pos, size_t c) const { return gguf::fp16_to_fp32(k[(pos % capacity) * stride + c]); }
  float vval(size_t pos, size_t c) const { return gguf::fp16_to_fp32(v[(pos % capacity) * stride + c]); }
};

// The converted cache of positions [first, valid_end), converted in pieces of 16 positions.
struct Converted {
  std::vector<uint16_t> k, v;
  k::KvBf16 view;
  Converted(const Ring& r, size_t first, size_t valid_end) {
    const size_t end = first + (valid_end - first + 15) / 16 * 16;
    k.resize((end - first) * r.hd);
    v.resize((end - first) * r.hd);
    for (size_t p = first; p < end; p += 16) {
      k::kv_to_bf16(r.k.data(), r.v.data(), r.stride, r.capacity, r.hd, first, valid_end, p, p + 16, k.data(),
                    v.data());
    }
    view = {k.data(), v.data(), first, end};
  }
};

// The kernel's arithmetic in float64: scores of the rounded q and k; the weights exp(s - max)
// rounded to bfloat16 (from float32, as the kernel holds them); normalized by their unrounded
// sum.
std::vector<double> reference(const Ring& r, const float* q, size_t begin, size_t end) {
  std::vector<double> s(end - begin), out(r.hd, 0.0);
  for (size_t p = begin; p < end; ++p) {
    double dot = 0;
    for (size_t c = 0; c < r.hd; ++c) dot += bf16(q[c]) * bf16(r.kval(p, c));
    s[p - begin] = dot;
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (size_t p = begin; p < end; ++p) {
    const float w = static_cast<float>(std::exp(s[p - begin] - mx));
    sum += w;
    for (size_t c = 0; c < r.hd; ++c) out[c] += bf16(w) * bf16(r.vval(p, c));
  }
  for (auto& o : out) o /= sum;
  return out;
}

}  // namespace

TEST(Bf16Attention, MatchesAFloat64ReferenceOfTheSameRounding) {
  // Query counts 1..16 (partial quads padded), ranges starting at odd and even positions and
  // inside a 16-position block, a ring that wraps (positions 40..139 in 100 slots), ranges
  // shorter and longer than a value block, head sizes 32 .. 512 (Gemma 3's 256, Gemma 4's 512).
  for (size_t hd : {32, 64, 256, 512}) {
    if (!k::bf16_attention_available(hd)) GTEST_SKIP() << "skipped: no AVX512-BF16";
    const Ring ring(100, hd);
    const size_t first = 40, valid_end = 139;
    const Converted cv(ring, first, valid_end);
    for (size_t n_q : {1, 3, 4, 8, 13, 16}) {
      const auto q = random_vector(n_q * hd, 30 + static_cast<uint32_t>(n_q), 0.3f);
      std::vector<size_t> begins(n_q), ends(n_q);
      std::vector<const float*> queries(n_q);
      std::vector<float> out(n_q * hd);
      std::vector<float*> outs(n_q);
      for (size_t i = 0; i < n_q; ++i) {
        begins[i] = first + 1 + (i * 7) % 23;
        ends[i] = std::min(valid_end, begins[i] + 5 + (i * 37) % 90);
        queries[i] = &q[i * hd];
        outs[i] = &out[i * hd];
      }
      k::attend_block_bf16(queries.data(), n_q, begins.data(), ends.data(), cv.view, hd, outs.data());
      for (size_t i = 0; i < n_q; ++i) {
        const auto ref = reference(ring, &q[i * hd], begins[i], ends[i]);
        for (size_t c = 0; c < hd; ++c) {
          // float32 sums against float64 ones, and a weight whose float32 score sits next to a
          // bfloat16 rounding boundary rounds to the neighbour (2^-8 of it): ~1e-3 at most
          // (a wrong layout or pairing is off by the outputs' size, ~0.3).
          ASSERT_NEAR(out[i * hd + c], ref[c], 2e-3) << "hd " << hd << " n_q " << n_q << " query " << i << " " << c;
        }
      }
    }
  }
}

TEST(Bf16Attention, AQuerysOutputDoesNotDependOnItsTile) {
  // The same queries alone, in a tile of 16 with other ranges (so another union and another
  // first block), and over a conversion that starts 16 positions earlier: the same bits.
  const size_t hd = 256;
  if (!k::bf16_attention_available(hd)) GTEST_SKIP() << "skipped: no AVX512-BF16";
  const Ring ring(300, hd);
  const Converted early(ring, 32, 290), late(ring, 48, 290);
  const size_t n_q = 16;
  const auto q = random_vector(n_q * hd, 40, 0.3f);
  std::vector<size_t> begins(n_q), ends(n_q);
  std::vector<const float*> queries(n_q);
  std::vector<float> tiled(n_q * hd);
  std::vector<float*> outs(n_q);
  for (size_t i = 0; i < n_q; ++i) {
    begins[i] = 49 + (i * 11) % 40;  // from an odd position inside the first block of `late`
    ends[i] = 150 + (i * 29) % 140;
    queries[i] = &q[i * hd];
    outs[i] = &tiled[i * hd];
  }
  k::attend_block_bf16(queries.data(), n_q, begins.data(), ends.data(), late.view, hd, outs.data());
  for (size_t i = 0; i < n_q; ++i) {
    for (const auto* cv : {&early, &late}) {
      std::vector<float> alone(hd);
      float* o = alone.data();
      k::attend_block_bf16(&queries[i], 1, &begins[i], &ends[i], cv->view, hd, &o);
      for (size_t c = 0; c < hd; ++c) ASSERT_EQ(alone[c], tiled[i * hd + c]) << "query " << i << " " << c;
    }
  }
}

TEST(Bf16Attention, StaysCloseToTheFloat32Path) {
  // Against attend() (float32 products of the fp16 cache): the bfloat16 rounding of Q, K, V and
  // the weights (2^-9 relative each) moves an output by under 1 % of the largest (measured
  // 0.25-0.75 % on a Zen 4 EPYC: scores of ~2.4 standard deviation amplify the score errors).
  const size_t hd = 256;
  if (!k::bf16_attention_available(hd)) GTEST_SKIP() << "skipped: no AVX512-BF16";
  const Ring ring(600, hd);
  const Converted cv(ring, 0, 600);
  const auto q = random_vector(4 * hd, 50, 0.3f);
  const size_t begins[4] = {0, 1, 88, 88}, ends[4] = {600, 512, 600, 89};
  const float* queries[4];
  float* outs[4];
  std::vector<float> out(4 * hd), ref(hd), scores(600);
  for (size_t i = 0; i < 4; ++i) queries[i] = &q[i * hd], outs[i] = &out[i * hd];
  k::attend_block_bf16(queries, 4, begins, ends, cv.view, hd, outs);
  for (size_t i = 0; i < 4; ++i) {
    k::attend(queries[i], ring.k.data(), ring.v.data(), ring.stride, ring.capacity, hd, begins[i], ends[i],
              scores.data(), ref.data());
    double err = 0, norm = 0;
    for (size_t c = 0; c < hd; ++c) {
      err = std::max(err, std::fabs(static_cast<double>(out[i * hd + c]) - ref[c]));
      norm = std::max(norm, std::fabs(static_cast<double>(ref[c])));
    }
    EXPECT_LT(err, 1e-2 * norm) << "query " << i;
    EXPECT_GT(err, 0.0) << "query " << i << ": no rounding at all?";
  }
}
