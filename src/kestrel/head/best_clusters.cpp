#include "kestrel/head/best_clusters.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace kestrel::head {
namespace {

// A float's bits as an unsigned key that sorts as the float does (larger float, larger key);
// -0 and +0 get the same key (they compare equal).
uint32_t ordered_key(float f) {
  f += 0.0f;  // -0 -> +0
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

}  // namespace

void best_indices(const float* scores, size_t n, size_t k, std::vector<uint32_t>& best) {
  constexpr int kRadixBits = 11;
  constexpr uint32_t kBuckets = 1u << kRadixBits;
  thread_local std::vector<uint32_t> keys;
  thread_local std::vector<uint32_t> count;
  thread_local std::vector<std::pair<uint32_t, uint32_t>> edge;  // (key, index) in the edge bucket
  best.clear();
  if (k >= n) {
    for (size_t i = 0; i < n; ++i) best.push_back(static_cast<uint32_t>(i));
    return;
  }
  if (k == 0) return;
  keys.resize(n);
  count.assign(kBuckets, 0);
  for (size_t i = 0; i < n; ++i) {
    keys[i] = ordered_key(scores[i]);
    ++count[keys[i] >> (32 - kRadixBits)];
  }
  // The bucket holding the k-th best: buckets above it hold `above` < k of the best.
  uint32_t bucket = kBuckets - 1;
  size_t above = 0;
  while (above + count[bucket] < k) above += count[bucket--];
  edge.clear();
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = keys[i] >> (32 - kRadixBits);
    if (b > bucket) best.push_back(static_cast<uint32_t>(i));
    else if (b == bucket) edge.emplace_back(keys[i], static_cast<uint32_t>(i));
  }
  const size_t need = k - above;
  std::partial_sort(edge.begin(), edge.begin() + static_cast<std::ptrdiff_t>(need), edge.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  const size_t mid = best.size();
  for (size_t j = 0; j < need; ++j) best.push_back(edge[j].second);
  std::sort(best.begin() + static_cast<std::ptrdiff_t>(mid), best.end());
  std::inplace_merge(best.begin(), best.begin() + static_cast<std::ptrdiff_t>(mid), best.end());
}

}  // namespace kestrel::head
