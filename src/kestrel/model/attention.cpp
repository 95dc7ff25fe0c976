#include "kestrel/model/attention.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "kestrel/kernels/matmul.h"
#include "kestrel/kernels/ops.h"

namespace kestrel::model {

void cached_attention(const AttentionShape& s, const float* q, size_t n, size_t pos0,
                      const LayerCache& lc, float* out, ThreadPool& pool) {
  const size_t hd = s.head_dim;
  const size_t q_dim = s.n_heads * hd;
  if (n > 1 && n < kernels::kTileMinTokens) {
    for (size_t t = 0; t < n; ++t) cached_attention(s, q + t * q_dim, 1, pos0 + t, lc, out + t * q_dim, pool);
    return;
  }
  const size_t group = s.n_heads / s.n_kv_heads;
  const size_t n_items = n * s.n_kv_heads;
  const size_t threads = static_cast<size_t>(pool.size());
  const uint16_t* kc = lc.k.data();
  const uint16_t* vc = lc.v.data();
  auto visible = [&](size_t t) {
    const size_t pos = pos0 + t;
    const size_t begin = s.window > 0 && pos + 1 > s.window ? pos + 1 - s.window : 0;
    return std::pair<size_t, size_t>{begin, pos + 1};
  };

  if (n_items >= threads && group <= kernels::kMaxBlockQueries && hd % 16 == 0) {
    // Prefill: a tile of consecutive tokens times the heads of one KV head reads each K/V row once.
    const size_t tile_tokens = std::max<size_t>(1, kernels::kMaxBlockQueries / group);
    const size_t n_tiles = (n + tile_tokens - 1) / tile_tokens;
    pool.parallel_for(n_tiles * s.n_kv_heads, 1, [&](size_t b, size_t e) {
      std::vector<float> scores(kernels::kMaxBlockQueries * (std::min(pos0 + n, lc.capacity) + tile_tokens));
      for (size_t item = b; item < e; ++item) {
        const size_t tile = item / s.n_kv_heads, g = item % s.n_kv_heads;
        const size_t t0 = tile * tile_tokens, t1 = std::min(n, t0 + tile_tokens);
        const float* queries[kernels::kMaxBlockQueries];
        float* outs[kernels::kMaxBlockQueries];
        size_t begins[kernels::kMaxBlockQueries], ends[kernels::kMaxBlockQueries];
        size_t n_q = 0;
        for (size_t t = t0; t < t1; ++t) {
          const auto [begin, end] = visible(t);
          for (size_t h = 0; h < group; ++h, ++n_q) {
            queries[n_q] = q + t * q_dim + (g * group + h) * hd;
            outs[n_q] = out + t * q_dim + (g * group + h) * hd;
            begins[n_q] = begin;
            ends[n_q] = end;
          }
        }
        kernels::attend_block(queries, n_q, begins, ends, kc + g * hd, vc + g * hd, lc.stride,
                              lc.capacity, hd, scores.data(), outs);
      }
    });
    return;
  }
  if (n_items >= threads) {
    pool.parallel_for(n_items, 1, [&](size_t b, size_t e) {
      std::vector<float> scores(group * (std::min(pos0 + n, lc.capacity) + 1));
      for (size_t item = b; item < e; ++item) {
        const size_t t = item / s.n_kv_heads, g = item % s.n_kv_heads;
        const auto [begin, end] = visible(t);
        kernels::attend_group(q + t * q_dim + g * group * hd, group, kc + g * hd, vc + g * hd,
                              lc.stride, lc.capacity, hd, begin, end, scores.data(),
                              out + t * q_dim + g * group * hd);
      }
    });
    return;
  }
  // Decode: each (token, KV head) item's visible range is cut into one slice per thread.
  std::vector<float> part_out(threads * group * hd), part_max(threads * group), part_sum(threads * group);
  std::vector<kernels::AttentionPartial> parts(threads);
  for (size_t p = 0; p < threads; ++p) {
    parts[p] = {&part_out[p * group * hd], &part_max[p * group], &part_sum[p * group]};
  }
  for (size_t item = 0; item < n_items; ++item) {
    const size_t t = item / s.n_kv_heads, g = item % s.n_kv_heads;
    const auto [begin, end] = visible(t);
    const size_t slice = (end - begin + threads - 1) / threads;
    const size_t n_parts = (end - begin + slice - 1) / slice;
    pool.parallel_for(n_parts, 1, [&](size_t pb, size_t pe) {
      std::vector<float> scores(group * slice);
      for (size_t p = pb; p < pe; ++p) {
        const size_t s0 = begin + p * slice, s1 = std::min(end, s0 + slice);
        kernels::attend_partial(q + t * q_dim + g * group * hd, group, kc + g * hd, vc + g * hd,
                                lc.stride, lc.capacity, hd, s0, s1, scores.data(), &parts[p]);
      }
    });
    kernels::merge_partials(parts.data(), n_parts, group, hd, out + t * q_dim + g * group * hd);
  }
}

}  // namespace kestrel::model
