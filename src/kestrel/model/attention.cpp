#include "kestrel/model/attention.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "kestrel/kernels/attention_bf16.h"
#include "kestrel/kernels/attention_kv.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/kernels/ops.h"

namespace kestrel::model {

namespace {

// The default cache: both halves fp16, which ops.h's kernels read (others: attention_kv.h).
bool fp16_cache(const LayerCache& lc) { return lc.k.type == KvType::kF16 && lc.v.type == KvType::kF16; }

// The visible positions [begin, end) of a query at `pos`: causal, within the window if any.
std::pair<size_t, size_t> visible(const AttentionShape& s, size_t pos) {
  const size_t begin = s.window > 0 && pos + 1 > s.window ? pos + 1 - s.window : 0;
  return {begin, pos + 1};
}

// A piece of cached_attention_rows' work: KV head g of row `row`, over positions [s0, s1).
// part == kWhole: the whole visible range, written normalized to the row's output; else slot
// `part` of the partial buffers, merged afterwards with the row's other slices.
struct Unit {
  size_t row, g, s0, s1, part;
};
constexpr size_t kWhole = ~size_t{0};

// A row's merge: slices [first, first + n) of the partial buffers into KV head g of `row`.
struct Merge {
  size_t row, g, first, n;
};

// The shortest slice, that of every visible range below 8,192 positions (cached_attention_rows):
// enough work per item to outweigh its merge (group x head_dim floats), and items for every
// thread from a few hundred positions on.
constexpr size_t kSlice = 128;

// The slice length for a visible range of `range` positions: kSlice below 8,192 positions,
// then kSlice x (range / 4,096), up to 8 x kSlice from 32,768 on, so that a long range is 32 or
// more items (enough for every thread) while each item streams its K and V rows for longer:
// every slice restarts two streams (K, V) that the prefetches have to refill, and adds a
// partial to merge.
// Decode attention at 32,704 positions, 2 Zen 3 threads: 2.58-2.75 ms with slices of 128,
// 2.17-2.48 with a fixed 1,024 (a trial; this gives 896 there). A function of the range only, never of the thread count or of the rows
// beside it, so that a row's bits do not depend on either.
constexpr size_t slice_length(size_t range) {
  return kSlice * std::clamp<size_t>(range / (32 * kSlice), 1, 8);
}

// Prefill tiles (tokens x one KV head's query heads) a thread takes at a time: few enough that
// the last ones, the costliest of a causal layer, end close together on every thread.
constexpr size_t kPrefillTilesPerGrab = 2;

// Positions of K and V a thread converts to bfloat16 at a time (whole blocks of 16).
constexpr size_t kConvertPositions = 64;

struct RowsScratch {
  std::vector<Unit> units;
  std::vector<Merge> merges;
  std::vector<float> part_out, part_max, part_sum;
  std::vector<kernels::AttentionPartial> parts;
};

// The K and V that a prefill chunk of n tokens from pos0 sees, per KV head, converted to
// bfloat16 (kernels/attention_bf16.h: from the first visible position, rounded down to even,
// to the chunk's end, rounded up to a block of 16) into a buffer of the calling thread's that
// the views point into until its next call. Pieces of kConvertPositions over the pool.
std::vector<kernels::KvBf16> kv_to_bf16(const AttentionShape& s, size_t n, size_t pos0, const LayerCache& lc,
                                        ThreadPool& pool) {
  const size_t hd = s.head_dim;
  const size_t first = visible(s, pos0).first & ~size_t{1};
  const size_t end = first + (pos0 + n - first + 15) / 16 * 16;
  const size_t head_elems = (end - first) * hd;
  thread_local std::vector<uint16_t> converted;
  if (converted.size() < 2 * s.n_kv_heads * head_elems) converted.resize(2 * s.n_kv_heads * head_elems);
  uint16_t* const buffer = converted.data();  // this thread's (the workers' thread_local differ)
  const size_t pieces = (end - first + kConvertPositions - 1) / kConvertPositions;
  pool.parallel_for(s.n_kv_heads * pieces, 1, [&](size_t b, size_t e) {
    for (size_t item = b; item < e; ++item) {
      const size_t g = item / pieces, p0 = first + (item % pieces) * kConvertPositions;
      uint16_t* kb = buffer + 2 * g * head_elems;
      kernels::kv_to_bf16(lc.k.head(g, hd), lc.v.head(g, hd), lc.capacity, hd, first, pos0 + n, p0,
                          std::min(end, p0 + kConvertPositions), kb, kb + head_elems);
    }
  });
  std::vector<kernels::KvBf16> views;
  for (size_t g = 0; g < s.n_kv_heads; ++g) {
    const uint16_t* kb = buffer + 2 * g * head_elems;
    views.push_back({kb, kb + head_elems, first, end});
  }
  return views;
}

}  // namespace

namespace {

// cached_attention_rows() on queries as the cache wants them.
void attend_rows(const AttentionShape& s, std::span<const AttentionRow> rows, ThreadPool& pool) {
  const size_t hd = s.head_dim, group = s.n_heads / s.n_kv_heads;
  // A row's plan depends on its visible range only, never on the thread count, so that its
  // result does not either: a range of at most kSlice positions is one item per KV head; a
  // longer one is cut into slices of slice_length(range) positions (from its first), whose
  // softmaxes are merged in order. (Cutting it into one slice per thread made greedy tokens
  // depend on -t.)
  thread_local RowsScratch scratch;
  auto& units = scratch.units;
  auto& merges = scratch.merges;
  units.clear();
  merges.clear();
  size_t n_parts_total = 0, longest = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto [begin, end] = visible(s, rows[r].pos);
    longest = std::max(longest, end - begin);
    const size_t slice = slice_length(end - begin);
    if (end - begin <= slice) {
      for (size_t g = 0; g < s.n_kv_heads; ++g) units.push_back({r, g, begin, end, kWhole});
      continue;
    }
    const size_t n_parts = (end - begin + slice - 1) / slice;
    for (size_t g = 0; g < s.n_kv_heads; ++g) {
      merges.push_back({r, g, n_parts_total, n_parts});
      for (size_t p = 0; p < n_parts; ++p) {
        const size_t s0 = begin + p * slice;
        units.push_back({r, g, s0, std::min(end, s0 + slice), n_parts_total++});
      }
    }
  }
  auto& part_out = scratch.part_out;
  auto& part_max = scratch.part_max;
  auto& part_sum = scratch.part_sum;
  auto& parts = scratch.parts;
  part_out.resize(n_parts_total * group * hd);
  part_max.resize(n_parts_total * group);
  part_sum.resize(n_parts_total * group);
  parts.resize(n_parts_total);
  for (size_t p = 0; p < n_parts_total; ++p) {
    parts[p] = {&part_out[p * group * hd], &part_max[p * group], &part_sum[p * group]};
  }
  const bool block = group <= kernels::kMaxBlockQueries && hd % 16 == 0;
  pool.parallel_for(units.size(), 1, [&](size_t b, size_t e) {
    thread_local std::vector<float> scores;  // this worker's
    if (scores.size() < group * longest) scores.resize(group * longest);
    for (size_t i = b; i < e; ++i) {
      const Unit& u = units[i];
      const AttentionRow& row = rows[u.row];
      const LayerCache& lc = *row.cache;
      const float* q = row.q + u.g * group * hd;
      float* out = row.out + u.g * group * hd;
      if (!fp16_cache(lc)) {  // bf16 or q8 (attention_kv.h): the typed kernels
        const kernels::KvHeadView kh = lc.k.head(u.g, hd), vh = lc.v.head(u.g, hd);
        if (u.part != kWhole) {
          const kernels::AttentionPartial& p = parts[u.part];
          kernels::attend_partial_kv(q, group, kh, vh, lc.capacity, hd, u.s0, u.s1, scores.data(), p.out, p.max, p.sum);
        } else {
          kernels::attend_group_kv(q, group, kh, vh, lc.capacity, hd, u.s0, u.s1, scores.data(), out);
        }
        continue;
      }
      const uint16_t* kc = lc.k.half.data() + u.g * hd;
      const uint16_t* vc = lc.v.half.data() + u.g * hd;
      if (u.part != kWhole) {
        kernels::attend_partial(q, group, kc, vc, lc.stride, lc.capacity, hd, u.s0, u.s1, scores.data(), &parts[u.part]);
      } else if (block) {
        const float* queries[kernels::kMaxBlockQueries];
        float* outs[kernels::kMaxBlockQueries];
        size_t begins[kernels::kMaxBlockQueries], ends[kernels::kMaxBlockQueries];
        for (size_t h = 0; h < group; ++h) {
          queries[h] = q + h * hd;
          outs[h] = out + h * hd;
          begins[h] = u.s0;
          ends[h] = u.s1;
        }
        kernels::attend_block(queries, group, begins, ends, kc, vc, lc.stride, lc.capacity, hd, scores.data(), outs);
      } else {
        kernels::attend_group(q, group, kc, vc, lc.stride, lc.capacity, hd, u.s0, u.s1, scores.data(), out);
      }
    }
  });
  for (const Merge& m : merges) {
    kernels::merge_partials(&parts[m.first], m.n, group, hd, rows[m.row].out + m.g * group * hd);
  }
}

}  // namespace

// Heads of a q8 cache stored Hadamard-rotated (KvTensor::rotated): the queries are rotated as K
// is, so that the scores are unchanged ((H q) . (H k) = q . k), and the outputs, sums of rotated
// V rows, are rotated back (H is its own inverse).
static void rotate_heads(float* x, size_t n_heads, size_t head_dim) {
  for (size_t h = 0; h < n_heads; ++h) kernels::hadamard_rotate(x + h * head_dim, head_dim);
}

void cached_attention_rows(const AttentionShape& s, std::span<const AttentionRow> rows, ThreadPool& pool) {
  if (rows.empty()) return;
  const bool rot_k = rows[0].cache->k.rotated, rot_v = rows[0].cache->v.rotated;
  if (!rot_k && !rot_v) {
    attend_rows(s, rows, pool);
    return;
  }
  thread_local std::vector<float> q_buffer;
  thread_local std::vector<AttentionRow> rotated;
  const size_t q_dim = s.n_heads * s.head_dim;
  rotated.assign(rows.begin(), rows.end());
  if (rot_k) {
    q_buffer.resize(rows.size() * q_dim);
    for (size_t r = 0; r < rows.size(); ++r) {
      std::copy_n(rows[r].q, q_dim, &q_buffer[r * q_dim]);
      rotate_heads(&q_buffer[r * q_dim], s.n_heads, s.head_dim);
      rotated[r].q = &q_buffer[r * q_dim];
    }
  }
  attend_rows(s, rotated, pool);
  if (rot_v) {
    for (const AttentionRow& row : rows) rotate_heads(row.out, s.n_heads, s.head_dim);
  }
}

namespace {

// cached_attention() of a chunk of prefill size, on queries as the cache wants them.
void attend_chunk(const AttentionShape& s, const float* q, size_t n, size_t pos0, const LayerCache& lc, float* out,
                  ThreadPool& pool) {
  const size_t hd = s.head_dim;
  const size_t q_dim = s.n_heads * hd;
  const size_t group = s.n_heads / s.n_kv_heads;
  const bool fp16 = fp16_cache(lc);
  const uint16_t* kc = lc.k.half.data();
  const uint16_t* vc = lc.v.half.data();
  const size_t n_items = n * s.n_kv_heads;
  // Never chosen by the thread count (the results must not depend on it).
  if (group <= kernels::kMaxBlockQueries && hd % 16 == 0) {
    // Prefill: a tile of consecutive tokens times the heads of one KV head reads each K/V row once.
    const size_t tile_tokens = std::max<size_t>(1, kernels::kMaxBlockQueries / group);
    const size_t n_tiles = (n + tile_tokens - 1) / tile_tokens;
    // With AVX512-BF16 (layers on int8 activations): bfloat16 tiles over the chunk's K and V,
    // converted once per KV head for every tile.
    const bool bf16 = s.bf16_tiles && kernels::bf16_attention_available(hd);
    std::vector<kernels::KvBf16> views;
    if (bf16) views = kv_to_bf16(s, n, pos0, lc, pool);
    // Causal tiles cost in proportion to the positions they see (later tokens see more), so
    // the tiles are handed out as threads become free: static halves left one thread with
    // three quarters of a global layer's work.
    pool.parallel_for_dynamic(n_tiles * s.n_kv_heads, kPrefillTilesPerGrab, [&](size_t b, size_t e) {
      thread_local std::vector<float> scores;  // the float32 tiles' (the bfloat16 ones keep their own)
      const size_t need = bf16 ? 0 : kernels::kMaxBlockQueries * (std::min(pos0 + n, lc.capacity) + tile_tokens);
      if (scores.size() < need) scores.resize(need);
      for (size_t item = b; item < e; ++item) {
        const size_t tile = item / s.n_kv_heads, g = item % s.n_kv_heads;
        const size_t t0 = tile * tile_tokens, t1 = std::min(n, t0 + tile_tokens);
        const float* queries[kernels::kMaxBlockQueries];
        float* outs[kernels::kMaxBlockQueries];
        size_t begins[kernels::kMaxBlockQueries], ends[kernels::kMaxBlockQueries];
        size_t n_q = 0;
        for (size_t t = t0; t < t1; ++t) {
          const auto [begin, end] = visible(s, pos0 + t);
          for (size_t h = 0; h < group; ++h, ++n_q) {
            queries[n_q] = q + t * q_dim + (g * group + h) * hd;
            outs[n_q] = out + t * q_dim + (g * group + h) * hd;
            begins[n_q] = begin;
            ends[n_q] = end;
          }
        }
        if (bf16) {
          kernels::attend_block_bf16(queries, n_q, begins, ends, views[g], hd, outs);
        } else if (!fp16) {
          kernels::attend_block_kv(queries, n_q, begins, ends, lc.k.head(g, hd), lc.v.head(g, hd), lc.capacity, hd,
                                   scores.data(), outs);
        } else {
          kernels::attend_block(queries, n_q, begins, ends, kc + g * hd, vc + g * hd, lc.stride,
                                lc.capacity, hd, scores.data(), outs);
        }
      }
    });
    return;
  }
  // Groups or head sizes the tiles do not take: each (token, KV head) item whole.
  pool.parallel_for(n_items, 1, [&](size_t b, size_t e) {
    std::vector<float> scores(group * (std::min(pos0 + n, lc.capacity) + 1));
    for (size_t item = b; item < e; ++item) {
      const size_t t = item / s.n_kv_heads, g = item % s.n_kv_heads;
      const auto [begin, end] = visible(s, pos0 + t);
      if (!fp16) {
        kernels::attend_group_kv(q + t * q_dim + g * group * hd, group, lc.k.head(g, hd), lc.v.head(g, hd),
                                 lc.capacity, hd, begin, end, scores.data(), out + t * q_dim + g * group * hd);
        continue;
      }
      kernels::attend_group(q + t * q_dim + g * group * hd, group, kc + g * hd, vc + g * hd,
                            lc.stride, lc.capacity, hd, begin, end, scores.data(),
                            out + t * q_dim + g * group * hd);
    }
  });
}

}  // namespace

void cached_attention(const AttentionShape& s, const float* q, size_t n, size_t pos0,
                      const LayerCache& lc, float* out, ThreadPool& pool) {
  const size_t q_dim = s.n_heads * s.head_dim;
  if (n < kernels::kTileMinTokens) {  // rows alone: decode, and short chunks (verification)
    thread_local std::vector<AttentionRow> rows;
    rows.clear();
    for (size_t t = 0; t < n; ++t) rows.push_back({q + t * q_dim, pos0 + t, &lc, out + t * q_dim});
    cached_attention_rows(s, rows, pool);
    return;
  }
  if (lc.k.rotated) {  // Hadamard-rotated heads (cached_attention_rows)
    thread_local std::vector<float> q_buffer;
    q_buffer.assign(q, q + n * q_dim);
    rotate_heads(q_buffer.data(), n * s.n_heads, s.head_dim);
    q = q_buffer.data();
  }
  attend_chunk(s, q, n, pos0, lc, out, pool);
  if (lc.v.rotated) rotate_heads(out, n * s.n_heads, s.head_dim);
}

}  // namespace kestrel::model
