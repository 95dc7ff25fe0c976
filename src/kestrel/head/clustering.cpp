#include "kestrel/head/clustering.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <mutex>
#include <random>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::head {
namespace {

constexpr size_t kCandidates = 16;    // clusters per row considered by the greedy assignment
constexpr size_t kScoreChunk = 4096;  // rows scored per matmul call

// Cosines S[i, c] = u_i . centroid_c of n unit rows against k unit centroids (bf16 products,
// float32 sums: plenty to rank directions). `pool` null: on the calling thread.
void score(const float* u, size_t n, size_t d, const std::vector<float>& centroids, size_t k,
           std::vector<float>& s, ThreadPool* pool) {
  std::vector<uint16_t> c16(k * d);
  for (size_t i = 0; i < c16.size(); ++i) c16[i] = gguf::fp32_to_bf16(centroids[i]);
  kernels::Matrix m;
  m.type = kernels::WeightType::kBF16;
  m.data = c16.data();
  m.rows = k;
  m.cols = d;
  s.resize(n * k);
  for (size_t b = 0; b < n; b += kScoreChunk) {
    const size_t e = std::min(n, b + kScoreChunk);
    if (pool) {
      kernels::matmul(m, u + b * d, e - b, d, &s[b * k], k, *pool);
    } else {
      kernels::matmul_rows(m, u + b * d, e - b, d, &s[b * k], k, 0, k);
    }
  }
}

// Capacity-constrained assignment: pairs (row, one of its best clusters) by decreasing cosine,
// each row to the first cluster with room; rows left over take their best cluster with room.
std::vector<uint32_t> assign_balanced(const std::vector<float>& s, size_t n, size_t k, size_t cap) {
  const size_t l = std::min(k, kCandidates);
  struct Pair {
    float score;
    uint32_t row, cluster;
  };
  std::vector<Pair> pairs;
  pairs.reserve(n * l);
  std::vector<uint32_t> idx(k);
  for (size_t i = 0; i < n; ++i) {
    const float* si = &s[i * k];
    std::iota(idx.begin(), idx.end(), 0u);
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(l), idx.end(),
                      [&](uint32_t a, uint32_t b) { return si[a] > si[b] || (si[a] == si[b] && a < b); });
    for (size_t j = 0; j < l; ++j) pairs.push_back({si[idx[j]], static_cast<uint32_t>(i), idx[j]});
  }
  std::sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) {
    if (a.score != b.score) return a.score > b.score;
    return a.row != b.row ? a.row < b.row : a.cluster < b.cluster;
  });
  constexpr uint32_t kNone = UINT32_MAX;
  std::vector<uint32_t> assignment(n, kNone);
  std::vector<size_t> count(k, 0);
  for (const Pair& p : pairs) {
    if (assignment[p.row] == kNone && count[p.cluster] < cap) {
      assignment[p.row] = p.cluster;
      ++count[p.cluster];
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (assignment[i] != kNone) continue;
    size_t best = k;
    for (size_t c = 0; c < k; ++c) {
      if (count[c] < cap && (best == k || s[i * k + c] > s[i * k + best])) best = c;
    }
    assignment[i] = static_cast<uint32_t>(best);
    ++count[best];
  }
  return assignment;
}

// Unit-length direction of the sum of the members' unit rows (spherical k-means update).
void update_centroids(const float* u, size_t n, size_t d, const std::vector<uint32_t>& assignment,
                      size_t k, std::vector<float>& centroids) {
  std::vector<double> sum(k * d, 0.0);
  for (size_t i = 0; i < n; ++i) {
    double* dst = &sum[assignment[i] * d];
    for (size_t j = 0; j < d; ++j) dst[j] += u[i * d + j];
  }
  for (size_t c = 0; c < k; ++c) {
    double norm = 0.0;
    for (size_t j = 0; j < d; ++j) norm += sum[c * d + j] * sum[c * d + j];
    if (norm <= 0.0) continue;  // keep the old direction
    const double inv = 1.0 / std::sqrt(norm);
    for (size_t j = 0; j < d; ++j) centroids[c * d + j] = static_cast<float>(sum[c * d + j] * inv);
  }
}

// Balanced spherical k-means of n unit rows into k clusters of n / k rows each.
std::vector<uint32_t> balanced_kmeans(const float* u, size_t n, size_t d, size_t k, size_t iterations,
                                      uint64_t seed, ThreadPool* pool,
                                      const std::function<void(size_t)>& on_iteration) {
  std::mt19937_64 rng(seed);
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), size_t{0});
  for (size_t i = 0; i < k; ++i) {  // k distinct rows, a partial Fisher-Yates shuffle
    std::uniform_int_distribution<size_t> pick(i, n - 1);
    std::swap(perm[i], perm[pick(rng)]);
  }
  std::vector<float> centroids(k * d);
  for (size_t c = 0; c < k; ++c) std::copy_n(u + perm[c] * d, d, &centroids[c * d]);
  std::vector<float> s;
  std::vector<uint32_t> assignment;
  for (size_t it = 0; it < iterations; ++it) {
    score(u, n, d, centroids, k, s, pool);
    auto next = assign_balanced(s, n, k, n / k);
    const bool stable = next == assignment;
    assignment = std::move(next);
    if (on_iteration) on_iteration(it);
    if (stable) break;
    update_centroids(u, n, d, assignment, k, centroids);
  }
  return assignment;
}

// The number of first-level groups: the largest divisor of k not above sqrt(k).
size_t group_count(size_t k) {
  size_t g = 1;
  for (size_t i = 1; i * i <= k; ++i) {
    if (k % i == 0) g = i;
  }
  return g;
}

}  // namespace

Clustering cluster_rows(const float* rows, size_t n_rows, size_t d, const ClusteringOptions& options,
                        ThreadPool& pool) {
  const size_t cap = options.cluster_size;
  if (cap == 0 || n_rows == 0 || n_rows % cap != 0) {
    throw Error("FlashHead: the cluster size " + std::to_string(cap) + " must divide the vocabulary (" +
                std::to_string(n_rows) + " tokens)");
  }
  if (options.iterations == 0) throw Error("FlashHead: at least one clustering iteration is needed");
  const size_t k = n_rows / cap;
  auto report = [&](double f, const std::string& what) {
    if (options.progress) options.progress(f, what);
  };

  // Unit rows (zero rows stay zero: they join whatever cluster has room).
  std::vector<float> u(n_rows * d);
  pool.parallel_for(n_rows, 256, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      double norm = 0.0;
      for (size_t j = 0; j < d; ++j) norm += static_cast<double>(rows[i * d + j]) * rows[i * d + j];
      const float inv = norm > 0.0 ? static_cast<float>(1.0 / std::sqrt(norm)) : 0.0f;
      for (size_t j = 0; j < d; ++j) u[i * d + j] = rows[i * d + j] * inv;
    }
  });

  // Level 1: groups of whole clusters.
  const size_t g = k >= 64 ? group_count(k) : 1;
  const size_t per_group = n_rows / g;  // rows
  const double level1_share = g > 1 ? 0.3 : 0.0;
  std::vector<uint32_t> group_of(n_rows, 0);
  if (g > 1) {
    group_of = balanced_kmeans(u.data(), n_rows, d, g, options.iterations, options.seed, &pool,
                               [&](size_t it) {
                                 report(level1_share * static_cast<double>(it + 1) / static_cast<double>(options.iterations),
                                        "level 1: " + std::to_string(g) + " groups");
                               });
  }
  std::vector<std::vector<uint32_t>> members(g);
  for (size_t i = 0; i < n_rows; ++i) members[group_of[i]].push_back(static_cast<uint32_t>(i));

  // Level 2: each group into clusters of `cap`, groups in parallel.
  const size_t k_per_group = per_group / cap;
  Clustering result;
  result.cluster_size = cap;
  result.n_clusters = k;
  result.order.resize(n_rows);
  std::vector<size_t> done(1, 0);
  std::mutex progress_mutex;
  pool.parallel_for(g, 1, [&](size_t gb, size_t ge) {
    std::vector<float> local;
    for (size_t gi = gb; gi < ge; ++gi) {
      const auto& rows_of = members[gi];
      local.resize(rows_of.size() * d);
      for (size_t i = 0; i < rows_of.size(); ++i) std::copy_n(&u[rows_of[i] * d], d, &local[i * d]);
      const auto assignment = balanced_kmeans(local.data(), rows_of.size(), d, k_per_group,
                                              options.iterations, options.seed + 1 + gi, nullptr, nullptr);
      std::vector<std::vector<int32_t>> clusters(k_per_group);
      for (size_t i = 0; i < rows_of.size(); ++i) clusters[assignment[i]].push_back(static_cast<int32_t>(rows_of[i]));
      size_t at = gi * per_group;
      for (auto& c : clusters) {
        std::sort(c.begin(), c.end());
        for (int32_t r : c) result.order[at++] = r;
      }
      std::lock_guard lock(progress_mutex);
      ++done[0];
      report(level1_share + (1.0 - level1_share) * static_cast<double>(done[0]) / static_cast<double>(g),
             "level 2: clusters of " + std::to_string(cap));
    }
  });

  // Stage-1 centroids: the mean of the raw rows; quality: cosine of rows to their direction.
  result.centroids.assign(k * d, 0.0f);
  result.radii.assign(k, 0.0f);
  std::vector<double> cosine_sum(k, 0.0);
  pool.parallel_for(k, 16, [&](size_t b, size_t e) {
    std::vector<double> mean(d), dir(d);
    for (size_t c = b; c < e; ++c) {
      std::fill(mean.begin(), mean.end(), 0.0);
      std::fill(dir.begin(), dir.end(), 0.0);
      for (size_t i = 0; i < cap; ++i) {
        const size_t r = static_cast<size_t>(result.order[c * cap + i]);
        for (size_t j = 0; j < d; ++j) {
          mean[j] += rows[r * d + j];
          dir[j] += u[r * d + j];
        }
      }
      double norm = 0.0;
      for (size_t j = 0; j < d; ++j) norm += dir[j] * dir[j];
      norm = norm > 0.0 ? std::sqrt(norm) : 1.0;
      for (size_t i = 0; i < cap; ++i) {
        const size_t r = static_cast<size_t>(result.order[c * cap + i]);
        double dot = 0.0;
        for (size_t j = 0; j < d; ++j) dot += u[r * d + j] * dir[j];
        cosine_sum[c] += dot / norm;
      }
      for (size_t j = 0; j < d; ++j) result.centroids[c * d + j] = static_cast<float>(mean[j] / static_cast<double>(cap));
      double radius2 = 0.0;
      for (size_t i = 0; i < cap; ++i) {
        const size_t r = static_cast<size_t>(result.order[c * cap + i]);
        double dist2 = 0.0;
        for (size_t j = 0; j < d; ++j) {
          const double diff = rows[r * d + j] - result.centroids[c * d + j];
          dist2 += diff * diff;
        }
        radius2 = std::max(radius2, dist2);
      }
      result.radii[c] = static_cast<float>(std::sqrt(radius2));
    }
  });
  result.mean_cosine = std::accumulate(cosine_sum.begin(), cosine_sum.end(), 0.0) / static_cast<double>(n_rows);
  report(1.0, "done");
  return result;
}

}  // namespace kestrel::head
