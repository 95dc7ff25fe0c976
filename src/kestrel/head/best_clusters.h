// Stage 1's selection: the indices of the k best scores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kestrel::head {

/// The k best of scores[0, n) — larger score first, the lower index on ties (the set
/// std::nth_element selects with that comparison) — in increasing index order, into `best`.
/// k >= n gives every index, k = 0 none; -0 and +0 are equal. A bucket select: one histogram
/// over 2,048 even buckets of [min, max], then an exact sort of the bucket where the k-th best
/// lies only; O(n), and allocation-free after the first call on a thread.
void best_indices(const float* scores, size_t n, size_t k, std::vector<uint32_t>& best);

}  // namespace kestrel::head
