#include "kestrel/head/best_clusters.h"

#include <algorithm>
#include <utility>

namespace kestrel::head {

void best_indices(const float* scores, size_t n, size_t k, std::vector<uint32_t>& best) {
  constexpr size_t kBuckets = 2048;
  thread_local std::vector<uint32_t> bucket_of;
  thread_local std::vector<uint32_t> count;
  thread_local std::vector<uint32_t> edge;  // indices in the edge bucket
  best.clear();
  if (k >= n) {
    for (size_t i = 0; i < n; ++i) best.push_back(static_cast<uint32_t>(i));
    return;
  }
  if (k == 0) return;
  // Buckets split [min, max] evenly. (s - lo) * scale rounds monotonically in s, so a larger
  // score never falls in a lower bucket, and -0 and +0 share one; NaN goes to bucket 0.
  float lo = scores[0], hi = scores[0];
  for (size_t i = 1; i < n; ++i) lo = std::min(lo, scores[i]), hi = std::max(hi, scores[i]);
  const float scale = hi > lo ? static_cast<float>(kBuckets - 1) / (hi - lo) : 0.0f;
  bucket_of.resize(n);
  count.assign(kBuckets, 0);
  for (size_t i = 0; i < n; ++i) {
    const float v = (scores[i] - lo) * scale;
    const uint32_t b = v >= 1.0f ? std::min(static_cast<uint32_t>(v), static_cast<uint32_t>(kBuckets - 1)) : 0u;
    bucket_of[i] = b;
    ++count[b];
  }
  // The bucket holding the k-th best: buckets above it hold `above` < k of the best.
  size_t bucket = kBuckets - 1, above = 0;
  while (above + count[bucket] < k) above += count[bucket--];
  edge.clear();
  for (size_t i = 0; i < n; ++i) {
    if (bucket_of[i] > bucket) best.push_back(static_cast<uint32_t>(i));
    else if (bucket_of[i] == bucket) edge.push_back(static_cast<uint32_t>(i));
  }
  // The edge bucket's best, in the order nth_element's comparison defines.
  const size_t need = k - above, mid = best.size();
  std::partial_sort(edge.begin(), edge.begin() + static_cast<std::ptrdiff_t>(need), edge.end(),
                    [&](uint32_t a, uint32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
  best.insert(best.end(), edge.begin(), edge.begin() + static_cast<std::ptrdiff_t>(need));
  std::sort(best.begin() + static_cast<std::ptrdiff_t>(mid), best.end());
  std::inplace_merge(best.begin(), best.begin() + static_cast<std::ptrdiff_t>(mid), best.end());
}

}  // namespace kestrel::head
