// Offline FlashHead build step: equal-size spherical clustering of the output head's rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kestrel/base/thread_pool.h"

namespace kestrel::head {

struct ClusteringOptions {
  size_t cluster_size = 16;  // tokens per cluster; must divide the number of rows
  size_t iterations = 8;     // Lloyd iterations per level
  uint64_t seed = 0;         // initial centroids; the result is a pure function of it
  /// Called now and then with (fraction done in [0, 1], what is running).
  std::function<void(double, const std::string&)> progress;
};

struct Clustering {
  size_t cluster_size = 0;
  size_t n_clusters = 0;
  /// [n_rows]: cluster k holds rows order[k * cluster_size .. (k + 1) * cluster_size), each
  /// cluster's rows ascending. A permutation of 0..n_rows-1.
  std::vector<int32_t> order;
  /// [n_clusters, d]: the mean of each cluster's (unnormalized) rows, the stage-1 centroid:
  /// h . centroid_k is the mean logit of cluster k.
  std::vector<float> centroids;
  /// [n_clusters]: the largest Euclidean distance of a member row from its centroid.
  std::vector<float> radii;
  double mean_cosine = 0;  // mean cosine of a row to its cluster's direction (quality)
};

/// Partitions the rows of `rows` (float32 [n_rows, d]) into n_rows / cluster_size clusters of
/// exactly cluster_size rows by their direction (spherical k-means, Dhillon & Modha 2001), with
/// a capacity-constrained assignment step: every (row, candidate cluster) pair is taken in order
/// of decreasing cosine, and a row joins its best cluster that still has room. Two levels keep
/// it fast (docs/flashhead.md): rows are first split into G equal groups of whole clusters by
/// the same balanced k-means, then each group is clustered on its own. Deterministic for a seed
/// and thread count independent. Throws kestrel::Error if cluster_size does not divide n_rows.
Clustering cluster_rows(const float* rows, size_t n_rows, size_t d, const ClusteringOptions& options,
                        ThreadPool& pool);

}  // namespace kestrel::head
