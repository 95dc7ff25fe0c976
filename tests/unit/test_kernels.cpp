// Kernels against scalar float64 references on odd shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/kernels/ops.h"
#include "hwy/targets.h"
#include "random_vector.h"

namespace k = kestrel::kernels;

namespace {

using kestrel::testing::random_vector;

// Q8_0 blocks written by hand: d = max|x| / 127, q = round(x / d) (ggml quantize_row_q8_0_ref).
std::vector<uint8_t> to_q8_0(const std::vector<float>& w) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < w.size() / 32; ++b) {
    float amax = 0;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(w[b * 32 + i]));
    const float d = amax / 127.0f;
    const uint16_t dh = kestrel::gguf::fp32_to_fp16(d);
    out.push_back(static_cast<uint8_t>(dh & 0xff));
    out.push_back(static_cast<uint8_t>(dh >> 8));
    for (size_t i = 0; i < 32; ++i) {
      const int q = d == 0 ? 0 : static_cast<int>(std::lround(w[b * 32 + i] / d));
      out.push_back(static_cast<uint8_t>(static_cast<int8_t>(q)));
    }
  }
  return out;
}

}  // namespace

TEST(Kernels, MatmulF32MatchesReferenceOnOddShapes) {
  kestrel::ThreadPool pool(3);
  for (auto [rows, cols, n] : std::vector<std::tuple<size_t, size_t, size_t>>{
           {1, 1, 1}, {7, 13, 3}, {33, 100, 5}, {64, 640, 9}, {130, 257, 4}}) {
    const auto w = random_vector(rows * cols, 1);
    const auto x = random_vector(n * (cols + 3), 2);
    k::Matrix m{k::WeightType::kF32, w.data(), rows, cols};
    std::vector<float> y(n * (rows + 1)), ref(n * (rows + 1));
    k::matmul(m, x.data(), n, cols + 3, y.data(), rows + 1, pool);
    k::matmul_reference(m, x.data(), n, cols + 3, ref.data(), rows + 1);
    for (size_t t = 0; t < n; ++t) {
      for (size_t r = 0; r < rows; ++r) {
        // float32 accumulation of `cols` products: error ~ sqrt(cols) * eps * |terms|.
        EXPECT_NEAR(y[t * (rows + 1) + r], ref[t * (rows + 1) + r], 1e-5 * std::sqrt(cols) * 4)
            << rows << "x" << cols << " t=" << t << " r=" << r;
      }
    }
  }
}

TEST(Kernels, MatmulQ8_0MatchesDequantizedReference) {
  kestrel::ThreadPool pool(2);
  const size_t rows = 37, cols = 96, n = 3;
  const auto blocks = to_q8_0(random_vector(rows * cols, 3));
  const auto x = random_vector(n * cols, 4);
  k::Matrix m{k::WeightType::kQ8_0, blocks.data(), rows, cols};
  std::vector<float> y(n * rows), ref(n * rows);
  k::matmul(m, x.data(), n, cols, y.data(), rows, pool);
  k::matmul_reference(m, x.data(), n, cols, ref.data(), rows);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], ref[i], 1e-4) << i;
}

TEST(Kernels, Q8_0ProductsAreTheSameAloneAndBesideOtherTokensOnEverySimdTarget) {
  // FlashHead scores one hidden state or a step's several (continuous batching, drafted tokens)
  // with the same Q8_0 rows: a (row, token) product must not depend on the tokens computed beside
  // it, on any SIMD target this CPU runs (each is also checked against the float64 reference).
  kestrel::ThreadPool pool(2);
  const size_t rows = 21, cols = 640 + 32, n = 9;
  const auto blocks = to_q8_0(random_vector(rows * cols, 5));
  const auto x = random_vector(n * cols, 6);
  const k::Matrix m{k::WeightType::kQ8_0, blocks.data(), rows, cols};
  std::vector<float> ref(n * rows);
  k::matmul_reference(m, x.data(), n, cols, ref.data(), rows);
  const auto targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    std::vector<float> alone(n * rows);
    for (size_t t = 0; t < n; ++t) {
      for (size_t r = 0; r < rows; ++r) k::matmul_rows(m, &x[t * cols], 1, cols, &alone[t * rows + r] - r, 0, r, r + 1);
    }
    for (size_t i = 0; i < alone.size(); ++i) {
      ASSERT_NEAR(alone[i], ref[i], 1e-4) << hwy::TargetName(target) << " " << i;
    }
    for (size_t tokens = 2; tokens <= n; ++tokens) {
      std::vector<float> y(tokens * rows);
      k::matmul(m, x.data(), tokens, cols, y.data(), rows, pool);
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_EQ(y[i], alone[i]) << hwy::TargetName(target) << " tokens=" << tokens << " i=" << i;
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(Kernels, RmsNormHandComputed) {
  // x = (3, 4): mean square 12.5, 1/sqrt(12.5) = 0.28284271.
  const float x[2] = {3, 4}, w[2] = {1, 2};
  float y[2];
  k::rms_norm(x, w, y, 2, 0.0f);
  EXPECT_NEAR(y[0], 3 * 0.28284271f, 1e-6);
  EXPECT_NEAR(y[1], 2 * 4 * 0.28284271f, 1e-6);
}

TEST(Kernels, GeluTanhKnownValues) {
  // gelu_tanh(1) = 0.8411920 and gelu_tanh(-2) = -0.0454023 (torch gelu approximate='tanh').
  const float gate[2] = {1.0f, -2.0f}, up[2] = {1.0f, 2.0f};
  float y[2];
  k::gelu_tanh_mul(gate, up, y, 2);
  EXPECT_NEAR(y[0], 0.8411920f, 1e-6);
  EXPECT_NEAR(y[1], 2 * -0.0454023f, 1e-6);
}

TEST(Kernels, SoftcapIsCapTimesTanhWhateverThePositionOnEveryTarget) {
  // z = cap * tanh(z / cap) against std::tanh (float64), for logits from -400 to 400 (past
  // the cap both ways) and the edge values 0 and +-inf; and each value's bits must be the same
  // alone (n = 1: the tail path) as inside a long run, so that rescoring one token equals the
  // dense logits (head::token_logits).
  std::vector<float> z;
  for (int i = -4000; i <= 4000; i += 7) z.push_back(0.1f * static_cast<float>(i));
  z.insert(z.end(), {0.0f, -0.0f, 1e-30f, INFINITY, -INFINITY});
  const float cap = 30.0f;
  const auto targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    std::vector<float> all = z;
    k::softcap(all.data(), all.size(), cap);
    for (size_t i = 0; i < z.size(); ++i) {
      const double want = cap * std::tanh(static_cast<double>(z[i]) / cap);
      ASSERT_NEAR(all[i], want, 4e-6 * cap) << hwy::TargetName(target) << " z=" << z[i];
      float one = z[i];
      k::softcap(&one, 1, cap);
      ASSERT_EQ(std::memcmp(&one, &all[i], sizeof one), 0) << hwy::TargetName(target) << " z=" << z[i];
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  float x = 1.0f;
  EXPECT_THROW(k::softcap(&x, 1, 0.0f), kestrel::Error);
}

TEST(Kernels, RopeRotatesPairsHalfApart) {
  // head_dim 4, n_rot 4: pairs (0,2) and (1,3); angles 90 and 0 degrees.
  float x[4] = {1, 2, 3, 4};
  const float cos_sin[4] = {0, 1, 1, 0};
  k::rope_neox(x, 1, 4, 4, cos_sin);
  EXPECT_FLOAT_EQ(x[0], -3);
  EXPECT_FLOAT_EQ(x[2], 1);
  EXPECT_FLOAT_EQ(x[1], 2);
  EXPECT_FLOAT_EQ(x[3], 4);
}

TEST(Kernels, AttendMatchesScalarSoftmaxOverRing) {
  const size_t hd = 40, capacity = 7, stride = hd + 8;
  std::vector<uint16_t> kc(capacity * stride), vc(capacity * stride);
  const auto kf = random_vector(capacity * stride, 5), vf = random_vector(capacity * stride, 6);
  k::to_fp16(kf.data(), kc.data(), kc.size());
  k::to_fp16(vf.data(), vc.data(), vc.size());
  const auto q = random_vector(hd, 7, 0.3f);
  // Positions 9..13 live in slots 2..6 of the ring of 7.
  std::vector<float> scores(8), out(hd);
  k::attend(q.data(), kc.data(), vc.data(), stride, capacity, hd, 9, 14, scores.data(), out.data());
  std::vector<double> s;
  double mx = -1e30, sum = 0;
  for (size_t p = 9; p < 14; ++p) {
    double dot = 0;
    for (size_t i = 0; i < hd; ++i) {
      dot += q[i] * kestrel::gguf::fp16_to_fp32(kc[(p % capacity) * stride + i]);
    }
    s.push_back(dot);
    mx = std::max(mx, dot);
  }
  for (auto& v : s) sum += v = std::exp(v - mx);
  for (size_t i = 0; i < hd; ++i) {
    double ref = 0;
    for (size_t j = 0; j < s.size(); ++j) {
      ref += s[j] / sum * kestrel::gguf::fp16_to_fp32(vc[((9 + j) % capacity) * stride + i]);
    }
    EXPECT_NEAR(out[i], ref, 1e-5) << i;
  }
}

TEST(Kernels, SplitAttentionMergesToTheWhole) {
  // Partials over slices of the cache, merged by log-sum-exp, equal one pass over all of it.
  const size_t hd = 32, group = 4, capacity = 50, stride = hd;
  std::vector<uint16_t> kc(capacity * stride), vc(capacity * stride);
  const auto kf = random_vector(kc.size(), 8), vf = random_vector(vc.size(), 9);
  k::to_fp16(kf.data(), kc.data(), kc.size());
  k::to_fp16(vf.data(), vc.data(), vc.size());
  const auto q = random_vector(group * hd, 10, 0.5f);
  std::vector<float> scores(group * capacity), whole(group * hd), merged(group * hd);
  k::attend_group(q.data(), group, kc.data(), vc.data(), stride, capacity, hd, 3, 47, scores.data(),
                  whole.data());
  const size_t cuts[] = {3, 10, 11, 30, 47};
  std::vector<float> out(4 * group * hd), mx(4 * group), sum(4 * group);
  std::vector<k::AttentionPartial> parts;
  for (size_t p = 0; p < 4; ++p) {
    parts.push_back({&out[p * group * hd], &mx[p * group], &sum[p * group]});
    k::attend_partial(q.data(), group, kc.data(), vc.data(), stride, capacity, hd, cuts[p],
                      cuts[p + 1], scores.data(), &parts.back());
  }
  k::merge_partials(parts.data(), parts.size(), group, hd, merged.data());
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(merged[i], whole[i], 1e-5) << i;
}

TEST(Kernels, ToFp16MatchesTheScalarConversionOnEveryTarget) {
  // The KV cache write (F16C's vcvtps2ph where the target has it) against gguf::fp32_to_fp16
  // (tested against numpy in test_dequant): float32 bit patterns across the whole range (normal,
  // subnormal results, ties, overflow to inf, NaN, both signs), a count that leaves a tail.
  std::vector<float> x;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 65521) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  for (uint32_t h = 0; h < 0x7C00; h += 7) {  // exact halfway points between neighbouring halves
    const float lo = kestrel::gguf::fp16_to_fp32(static_cast<uint16_t>(h));
    const float hi = kestrel::gguf::fp16_to_fp32(static_cast<uint16_t>(h + 1));
    x.push_back(lo + (hi - lo) / 2);
    x.push_back(-(lo + (hi - lo) / 2));
  }
  x.push_back(65520.0f);
  x.push_back(65519.0f);
  x.pop_back();  // an odd count: a tail past the vectors
  std::vector<uint16_t> want(x.size()), got(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = kestrel::gguf::fp32_to_fp16(x[i]);
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    std::fill(got.begin(), got.end(), uint16_t{0});
    k::to_fp16(x.data(), got.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << hwy::TargetName(target) << std::hex << " f32 0x" << std::bit_cast<uint32_t>(x[i]);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(Kernels, AttentionBlockMatchesPerQueryAttention) {
  // A prefill tile (queries with different causal ranges) equals attending query by query, bit
  // for bit, on every SIMD target this CPU runs: for the query counts with a compile-time kernel
  // (1, 2, 4, 8, 16: decode and whole tiles; for 8 and 16 on AVX-512, 4 x 4 tiles of rows x queries reduced
  // together) and others, over a ring buffer that wraps (positions 30..69 in 40 slots, with a
  // row stride wider than one head), more rows than one value block (16) and row counts that
  // leave 1-3 rows past the 4-row tiles; head_dim 32 and 64.
  const size_t capacity = 40;
  for (size_t hd : {32, 64}) {
    const size_t stride = 2 * hd;
    std::vector<uint16_t> kc(capacity * stride), vc(capacity * stride);
    const auto kf = random_vector(kc.size(), 12), vf = random_vector(vc.size(), 13);
    k::to_fp16(kf.data(), kc.data(), kc.size());
    k::to_fp16(vf.data(), vc.data(), vc.size());
    for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      for (size_t n_q : {1, 2, 4, 6, 8, 16}) {
        const auto q = random_vector(n_q * hd, 14 + static_cast<uint32_t>(n_q), 0.5f);
        std::vector<size_t> begins(n_q), ends(n_q);
        std::vector<const float*> queries(n_q);
        std::vector<float*> outs(n_q);
        std::vector<float> out(n_q * hd), ref(n_q * hd), scores(n_q * capacity);
        for (size_t i = 0; i < n_q; ++i) {
          begins[i] = 30 + (i * 3) % 7;
          ends[i] = 50 + (i * 5) % 20;
          queries[i] = &q[i * hd];
          outs[i] = &out[i * hd];
          k::attend(&q[i * hd], kc.data() + hd, vc.data() + hd, stride, capacity, hd, begins[i], ends[i],
                    scores.data(), &ref[i * hd]);
        }
        k::attend_block(queries.data(), n_q, begins.data(), ends.data(), kc.data() + hd, vc.data() + hd,
                        stride, capacity, hd, scores.data(), outs.data());
        for (size_t i = 0; i < out.size(); ++i) {
          ASSERT_EQ(out[i], ref[i]) << hwy::TargetName(target) << " hd " << hd << " n_q " << n_q << " " << i;
        }
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

TEST(Kernels, SumExpShiftedEqualsTheSequentialFloat64Sum) {
  std::mt19937 rng(7);
  std::normal_distribution<float> logit(0.0f, 6.0f);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{33}, size_t{1000}, size_t{262144}}) {
    std::vector<float> x(n);
    for (auto& v : x) v = logit(rng);
    if (n > 20) x[3] = -INFINITY, x[11] = -2000.0f;  // masked and underflowing entries add 0
    float mx = -INFINITY;
    for (float v : x) mx = std::max(mx, v);
    const double shift = n == 0 ? 0.0 : mx;
    double ref = 0;
    for (float v : x) ref += std::exp(static_cast<double>(v) - shift);
    const double got = k::sum_exp_shifted(x.data(), n, shift);
    // Both sums round: a sequential float64 sum of n positive terms is within (n - 1) * 2^-53 of
    // exact (relative; Higham, Accuracy and Stability, 4.2), and each Exp is within 1 ulp.
    EXPECT_NEAR(got, ref, (static_cast<double>(n) + 2) * 0x1p-52 * ref) << n;
  }
}
