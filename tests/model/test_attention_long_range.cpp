// Decode attention over long visible ranges (model/attention.cpp): ranges from 8,192 positions
// on are cut into slices longer than 128 (slice_length), so this checks, past that length and
// for every KV cache type, that a row's output is
//   - close to a float64 softmax(q . K) V over the cache's dequantized rows, so no slice is
//     dropped or merged twice;
//   - bit-identical on 1 and 2 threads, and alone or batched with rows of other lengths
//     (cached_attention_rows' promise, on which batching's exactness rests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/kernels/attention_kv.h"
#include "kestrel/model/attention.h"
#include "kestrel/model/kv_cache.h"

namespace {

using kestrel::ThreadPool;
using kestrel::model::AttentionRow;
using kestrel::model::AttentionShape;
using kestrel::model::KvCache;
using kestrel::model::KvType;
using kestrel::model::LayerCache;

std::vector<float> gaussian(size_t n, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Gemma 3 270M's attention shape: 4 query heads on one KV head of 256.
constexpr AttentionShape kShape{4, 1, 256, 0};
constexpr size_t kCapacity = 9300;

struct Filled {
  LayerCache lc;
  std::vector<float> k_rows, v_rows;  // [capacity, 256] as the cache holds them (dequantized)
};

Filled fill(KvType type, uint32_t seed) {
  const size_t hd = kShape.head_dim;
  Filled f;
  f.lc = KvCache::allocate(kCapacity, {{kCapacity, hd, 0, hd}}, {type, type}).layers[0];
  const auto k = gaussian(kCapacity * hd, seed, 1.0f), v = gaussian(kCapacity * hd, seed + 1, 1.0f);
  f.k_rows.resize(k.size());
  f.v_rows.resize(v.size());
  const size_t block = kestrel::kernels::kv_q8_block(hd);
  std::vector<int8_t> q8(hd);
  std::vector<uint16_t> half(hd), scales(hd / block);
  for (size_t p = 0; p < kCapacity; ++p) {
    f.lc.k.write(p, &k[p * hd]);
    f.lc.v.write(p, &v[p * hd]);
    for (auto [src, dst] : {std::pair{&k, &f.k_rows}, std::pair{&v, &f.v_rows}}) {
      void* row = type == KvType::kQ8 ? static_cast<void*>(q8.data()) : static_cast<void*>(half.data());
      kestrel::kernels::kv_write_row(type, &(*src)[p * hd], hd, block, row, scales.data());
      kestrel::kernels::kv_read_row(type, row, scales.data(), hd, block, &(*dst)[p * hd]);
    }
  }
  return f;
}

// Query head h's output over positions [0, pos], in float64.
std::vector<double> reference(const Filled& f, const float* q, size_t pos) {
  const size_t hd = kShape.head_dim;
  std::vector<double> s(pos + 1), out(hd, 0.0);
  double mx = -INFINITY, sum = 0.0;
  for (size_t p = 0; p <= pos; ++p) {
    double d = 0.0;
    for (size_t c = 0; c < hd; ++c) d += static_cast<double>(q[c]) * f.k_rows[p * hd + c];
    mx = std::max(mx, s[p] = d);
  }
  for (auto& x : s) sum += x = std::exp(x - mx);
  for (size_t p = 0; p <= pos; ++p) {
    for (size_t c = 0; c < hd; ++c) out[c] += s[p] / sum * f.v_rows[p * hd + c];
  }
  return out;
}

}  // namespace

TEST(AttentionLongRange, SlicedRowsMatchFloat64AndDoNotDependOnThreadsOrBatch) {
  const size_t q_dim = kShape.n_heads * kShape.head_dim;
  // Ranges below, at and past the lengths where slices grow (8,192 and 8,192 + a slice).
  const size_t positions[] = {3000, 8191, 8192, 8500, 9299};
  for (KvType type : {KvType::kF16, KvType::kQ8, KvType::kBF16}) {
    const Filled f = fill(type, 11);
    const auto q = gaussian(std::size(positions) * q_dim, 7, 0.1f);
    std::vector<float> alone1(q.size()), alone2(q.size()), batched(q.size());
    ThreadPool one(1), two(2);
    std::vector<AttentionRow> rows;
    for (size_t r = 0; r < std::size(positions); ++r) {
      const AttentionRow a{&q[r * q_dim], positions[r], &f.lc, &alone1[r * q_dim]};
      kestrel::model::cached_attention_rows(kShape, std::span(&a, 1), one);
      const AttentionRow b{&q[r * q_dim], positions[r], &f.lc, &alone2[r * q_dim]};
      kestrel::model::cached_attention_rows(kShape, std::span(&b, 1), two);
      rows.push_back({&q[r * q_dim], positions[r], &f.lc, &batched[r * q_dim]});
    }
    kestrel::model::cached_attention_rows(kShape, rows, two);
    const std::string what = std::string("KV ") + kestrel::kernels::kv_type_name(type);
    for (size_t i = 0; i < q.size(); ++i) {
      ASSERT_EQ(alone1[i], alone2[i]) << what << ": 1 and 2 threads differ at " << i;
      ASSERT_EQ(alone2[i], batched[i]) << what << ": alone and batched differ at " << i;
    }
    for (size_t r = 0; r < std::size(positions); ++r) {
      for (size_t h = 0; h < kShape.n_heads; ++h) {
        const size_t at = r * q_dim + h * kShape.head_dim;
        const auto want = reference(f, &q[at], positions[r]);
        for (size_t c = 0; c < kShape.head_dim; ++c) {
          ASSERT_NEAR(alone1[at + c], want[c], 2e-5) << what << " position " << positions[r] << " head " << h;
        }
      }
    }
  }
}
