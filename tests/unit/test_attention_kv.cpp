// The typed KV cache's rows and attention (kernels/attention_kv.h): q8's quantize / dequantize
// round trip within half a step of its block's scale; f16 and bf16 rows equal the scalar
// conversions; the attention kernels over every element-type pair against a float64 reference
// computed on the dequantized values, on every SIMD target this CPU runs; and the bfloat16
// prefill tile's conversion of a typed cache equals its fp16 one for an fp16 cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/attention_bf16.h"
#include "kestrel/kernels/attention_kv.h"
#include "kestrel/kernels/ops.h"

namespace k = kestrel::kernels;
using k::KvType;

namespace {

std::vector<float> gaussian(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A cache of `capacity` slots of `stride` elements in one type, written from float rows.
struct TypedCache {
  KvType type;
  size_t stride, block;
  std::vector<uint16_t> half;
  std::vector<int8_t> q;
  std::vector<uint16_t> scales;
  std::vector<float> dequantized;  // [capacity, stride]: what the kernels must see

  TypedCache(KvType t, size_t capacity, size_t stride_, size_t block_, const std::vector<float>& x)
      : type(t), stride(stride_), block(block_), dequantized(capacity * stride_) {
    if (t == KvType::kQ8) {
      q.resize(capacity * stride);
      scales.resize(capacity * stride / block);
    } else {
      half.resize(capacity * stride);
    }
    for (size_t s = 0; s < capacity; ++s) {
      void* row = t == KvType::kQ8 ? static_cast<void*>(&q[s * stride]) : static_cast<void*>(&half[s * stride]);
      uint16_t* sc = t == KvType::kQ8 ? &scales[s * stride / block] : nullptr;
      k::kv_write_row(t, &x[s * stride], stride, block, row, sc);
      k::kv_read_row(t, row, sc, stride, block, &dequantized[s * stride]);
    }
  }
  k::KvHeadView head(size_t g, size_t hd) const {
    k::KvHeadView v{type, nullptr, nullptr, stride, stride / block, block};
    if (type == KvType::kQ8) {
      v.data = q.data() + g * hd;
      v.scales = scales.data() + g * hd / block;
    } else {
      v.data = half.data() + g * hd;
    }
    return v;
  }
};

// softmax(q . K) V over positions [b, e) of KV head g, in float64 on the dequantized rows.
std::vector<double> reference(const float* q, const TypedCache& kc, const TypedCache& vc, size_t capacity, size_t g,
                              size_t hd, size_t b, size_t e) {
  std::vector<double> s(e - b), out(hd, 0.0);
  double mx = -INFINITY, sum = 0.0;
  for (size_t p = b; p < e; ++p) {
    const float* kr = &kc.dequantized[(p % capacity) * kc.stride + g * hd];
    double d = 0.0;
    for (size_t c = 0; c < hd; ++c) d += static_cast<double>(q[c]) * kr[c];
    s[p - b] = d;
    mx = std::max(mx, d);
  }
  for (auto& x : s) sum += x = std::exp(x - mx);
  for (size_t p = b; p < e; ++p) {
    const float* vr = &vc.dequantized[(p % capacity) * vc.stride + g * hd];
    for (size_t c = 0; c < hd; ++c) out[c] += s[p - b] / sum * vr[c];
  }
  return out;
}

void expect_close(const float* got, const std::vector<double>& want, const std::string& what) {
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t c = 0; c < want.size(); ++c) {
    ASSERT_NEAR(got[c], want[c], 2e-5 * (1.0 + scale)) << what << " element " << c;
  }
}

}  // namespace

TEST(KvQ8, RoundTripWithinHalfAStepOfTheBlockScale) {
  const size_t n = 256, block = 32;
  // Rows of several magnitudes, one with an outlier per block, one tiny (fp16 subnormal scales).
  for (const float magnitude : {1.0f, 30.0f, 1e-6f}) {
    auto x = gaussian(n, 11, magnitude);
    x[5] *= 40.0f;
    std::vector<int8_t> q(n);
    std::vector<uint16_t> scales(n / block);
    std::vector<float> y(n);
    k::kv_write_row(KvType::kQ8, x.data(), n, block, q.data(), scales.data());
    k::kv_read_row(KvType::kQ8, q.data(), scales.data(), n, block, y.data());
    for (size_t b = 0; b < n / block; ++b) {
      float amax = 0.0f;
      for (size_t i = b * block; i < (b + 1) * block; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float d = kestrel::gguf::fp16_to_fp32(scales[b]);
      // d is amax / 127 rounded to fp16 (11 significant bits, or a subnormal's spacing).
      EXPECT_NEAR(d, amax / 127.0f, amax / 127.0f * 1e-3f + 6e-8f) << magnitude << " block " << b;
      for (size_t i = b * block; i < (b + 1) * block; ++i) {
        EXPECT_GE(q[i], -127);
        // Half a step, plus what the clamp at 127 cuts when d rounded down.
        const float bound = 0.5f * d + std::max(0.0f, std::fabs(x[i]) - 127.0f * d) + 1e-7f * amax;
        EXPECT_LE(std::fabs(y[i] - x[i]), bound) << magnitude << " element " << i;
      }
    }
  }
}

TEST(KvQ8, ZerosStayZeroAndNanStaysNan) {
  std::vector<float> x(64, 0.0f), y(64);
  std::vector<int8_t> q(64, 1);
  std::vector<uint16_t> s(2, 1);
  k::kv_write_row(KvType::kQ8, x.data(), 64, 32, q.data(), s.data());
  k::kv_read_row(KvType::kQ8, q.data(), s.data(), 64, 32, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
  x[40] = NAN;
  k::kv_write_row(KvType::kQ8, x.data(), 64, 32, q.data(), s.data());
  k::kv_read_row(KvType::kQ8, q.data(), s.data(), 64, 32, y.data());
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_TRUE(std::isnan(y[40]));
}

TEST(KvQ8, HalfTypesEqualTheScalarConversions) {
  const auto x = gaussian(96, 12, 3.0f);
  std::vector<uint16_t> h(96);
  k::kv_write_row(KvType::kF16, x.data(), 96, 32, h.data(), nullptr);
  for (size_t i = 0; i < 96; ++i) EXPECT_EQ(h[i], kestrel::gguf::fp32_to_fp16(x[i]));
  k::kv_write_row(KvType::kBF16, x.data(), 96, 32, h.data(), nullptr);
  for (size_t i = 0; i < 96; ++i) EXPECT_EQ(h[i], kestrel::gguf::fp32_to_bf16(x[i]));
}

TEST(KvQ8, NamesAndSizes) {
  EXPECT_EQ(k::parse_kv_type("q8_0", "-ctk"), KvType::kQ8);
  EXPECT_EQ(k::parse_kv_type("fp16", "-ctk"), KvType::kF16);
  EXPECT_THROW(k::parse_kv_type("q4_0", "--cache-type-k"), kestrel::Error);
  EXPECT_EQ(k::kv_q8_block(256), 32u);
  EXPECT_EQ(k::kv_q8_block(8), 8u);
  EXPECT_EQ(k::kv_row_bytes(KvType::kQ8, 256, 32), 256u + 16u);  // 17/32 of f16's 512
  EXPECT_EQ(k::kv_row_bytes(KvType::kF16, 256, 32), 512u);
}

TEST(KvQ8, AttentionMatchesFloat64ReferenceOnEverySimdTarget) {
  struct Case {
    KvType kt, vt;
    size_t hd, block, n_kv;
  };
  const Case cases[] = {
      {KvType::kQ8, KvType::kQ8, 256, 32, 1},   {KvType::kQ8, KvType::kQ8, 64, 32, 2},
      {KvType::kQ8, KvType::kF16, 256, 32, 1},  {KvType::kF16, KvType::kQ8, 32, 32, 2},
      {KvType::kBF16, KvType::kBF16, 64, 32, 1}, {KvType::kQ8, KvType::kBF16, 512, 32, 1},
      {KvType::kQ8, KvType::kQ8, 256, 256, 1},  {KvType::kQ8, KvType::kQ8, 8, 8, 1},
  };
  const size_t capacity = 300;  // a ring: positions past it wrap
  const auto targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (const Case& c : cases) {
    const size_t stride = c.n_kv * c.hd;
    const TypedCache kc(c.kt, capacity, stride, c.block, gaussian(capacity * stride, 1, 2.0f));
    const TypedCache vc(c.vt, capacity, stride, c.block, gaussian(capacity * stride, 2));
    for (const size_t group : {size_t{1}, size_t{3}, size_t{4}, size_t{8}}) {
      const auto q = gaussian(group * c.hd, 3, 0.15f);
      // Ranges: short, one crossing the ring's wrap, a long one.
      const std::pair<size_t, size_t> ranges[] = {{0, 1}, {10, 45}, {250, 340}, {130, 429}};
      for (int64_t target : targets) {
        hwy::SetSupportedTargetsForTest(target);
        for (size_t g = 0; g < c.n_kv; ++g) {
          for (const auto& [b, e] : ranges) {
            const std::string what = std::string(hwy::TargetName(target)) + " K " + k::kv_type_name(c.kt) + " V " +
                                     k::kv_type_name(c.vt) + " hd " + std::to_string(c.hd) + " block " +
                                     std::to_string(c.block) + " group " + std::to_string(group) + " range " +
                                     std::to_string(b) + ".." + std::to_string(e);
            std::vector<float> scores(group * (e - b)), out(group * c.hd);
            k::attend_group_kv(q.data(), group, kc.head(g, c.hd), vc.head(g, c.hd), capacity, c.hd, b, e,
                               scores.data(), out.data());
            // The same queries as a prefill tile with per-query ranges (each its own end).
            std::vector<float> tile_out(group * c.hd), tile_scores(group * (e - b));
            std::vector<const float*> qs(group);
            std::vector<float*> outs(group);
            std::vector<size_t> begins(group, b), ends(group);
            for (size_t h = 0; h < group; ++h) {
              qs[h] = &q[h * c.hd];
              outs[h] = &tile_out[h * c.hd];
              ends[h] = e - (group - 1 - h) * std::min<size_t>(1, e - b - 1);
            }
            k::attend_block_kv(qs.data(), group, begins.data(), ends.data(), kc.head(g, c.hd), vc.head(g, c.hd),
                               capacity, c.hd, tile_scores.data(), outs.data());
            for (size_t h = 0; h < group; ++h) {
              expect_close(&out[h * c.hd], reference(&q[h * c.hd], kc, vc, capacity, g, c.hd, b, e), what);
              expect_close(&tile_out[h * c.hd], reference(&q[h * c.hd], kc, vc, capacity, g, c.hd, b, ends[h]),
                           what + " tile");
            }
            if (HasFailure()) {
              hwy::SetSupportedTargetsForTest(0);
              return;
            }
          }
        }
      }
      hwy::SetSupportedTargetsForTest(0);
    }
  }
}

TEST(KvQ8, PartialSlicesMergeToTheWhole) {
  // Decode splits a long range into slices (attend_partial_kv) and merges them (merge_partials).
  const size_t hd = 256, capacity = 600, group = 4;
  const TypedCache kc(KvType::kQ8, capacity, hd, 32, gaussian(capacity * hd, 4, 2.0f));
  const TypedCache vc(KvType::kQ8, capacity, hd, 32, gaussian(capacity * hd, 5));
  const auto q = gaussian(group * hd, 6, 0.15f);
  const size_t b = 7, e = 551, slice = 128;
  std::vector<std::vector<float>> o, mx, sm;
  std::vector<k::AttentionPartial> parts;
  std::vector<float> scores(group * slice);
  for (size_t s0 = b; s0 < e; s0 += slice) {
    o.emplace_back(group * hd), mx.emplace_back(group), sm.emplace_back(group);
  }
  size_t i = 0;
  for (size_t s0 = b; s0 < e; s0 += slice, ++i) {
    k::attend_partial_kv(q.data(), group, kc.head(0, hd), vc.head(0, hd), capacity, hd, s0, std::min(e, s0 + slice),
                         scores.data(), o[i].data(), mx[i].data(), sm[i].data());
    parts.push_back({o[i].data(), mx[i].data(), sm[i].data()});
  }
  std::vector<float> out(group * hd);
  k::merge_partials(parts.data(), parts.size(), group, hd, out.data());
  for (size_t h = 0; h < group; ++h) {
    expect_close(&out[h * hd], reference(&q[h * hd], kc, vc, capacity, 0, hd, b, e), "merged");
  }
}

TEST(KvQ8, Bf16TileConversionOfAnFp16CacheIsUnchanged) {
  const size_t hd = 256, capacity = 80;
  if (!k::bf16_attention_available(hd)) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const TypedCache kc(KvType::kF16, capacity, hd, 32, gaussian(capacity * hd, 7));
  const TypedCache vc(KvType::kF16, capacity, hd, 32, gaussian(capacity * hd, 8));
  const size_t first = 0, end = 64, valid_end = 57;
  std::vector<uint16_t> k1(end * hd), v1(end * hd), k2(end * hd), v2(end * hd);
  k::kv_to_bf16(kc.half.data(), vc.half.data(), hd, capacity, hd, first, valid_end, 0, end, k1.data(), v1.data());
  k::kv_to_bf16(kc.head(0, hd), vc.head(0, hd), capacity, hd, first, valid_end, 0, end, k2.data(), v2.data());
  EXPECT_EQ(k1, k2);
  EXPECT_EQ(v1, v2);
  // A q8 cache converts its dequantized values (exact in float32) to bfloat16.
  const TypedCache kq(KvType::kQ8, capacity, hd, 32, gaussian(capacity * hd, 7));
  std::vector<uint16_t> k3(end * hd), v3(end * hd);
  k::kv_to_bf16(kq.head(0, hd), vc.head(0, hd), capacity, hd, first, valid_end, 0, end, k3.data(), v3.data());
  EXPECT_EQ(v3, v1);
  // Block layout (attention_bf16.h): position p's element pair c2 at block p/16, 32 c2 + 2 (p % 16).
  for (size_t p = 0; p < valid_end; ++p) {
    for (size_t c = 0; c < hd; ++c) {
      const uint16_t got = k3[(p / 16) * 16 * hd + 32 * (c / 2) + 2 * (p % 16) + c % 2];
      ASSERT_EQ(got, kestrel::gguf::fp32_to_bf16(kq.dequantized[p * hd + c])) << p << " " << c;
    }
  }
}

TEST(KvQ8, HadamardRotationIsOrthonormalAndItsOwnInverse) {
  const size_t n = 256;
  const auto a = gaussian(n, 21), b = gaussian(n, 22);
  auto ra = a, rb = b;
  k::hadamard_rotate(ra.data(), n);
  k::hadamard_rotate(rb.data(), n);
  double dot = 0.0, rdot = 0.0;
  for (size_t i = 0; i < n; ++i) dot += static_cast<double>(a[i]) * b[i], rdot += static_cast<double>(ra[i]) * rb[i];
  EXPECT_NEAR(rdot, dot, 1e-4 * (1.0 + std::fabs(dot)));
  // Row i of H / sqrt(n) times e_0 is 1 / sqrt(n) in every element.
  std::vector<float> e(n, 0.0f);
  e[0] = 1.0f;
  k::hadamard_rotate(e.data(), n);
  for (float x : e) EXPECT_FLOAT_EQ(x, 1.0f / 16.0f);
  k::hadamard_rotate(ra.data(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(ra[i], a[i], 1e-5f);
  EXPECT_THROW(k::hadamard_rotate(ra.data(), 48), kestrel::Error);
}
