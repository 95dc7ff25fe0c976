// FlashHead's proof of the greedy token (docs/flashhead.md, "The greedy proof"): an upper bound
// on the logit the dense head computes for any row of a cluster, from the cluster's stage-1
// score and two numbers per cluster stored in the image.
//
// The arithmetic bounded is the one of a Q8_0 head with int8 activations (gemv_q8_rows.h, the
// default on AVX2 / AVX512-VNNI CPUs): per row w and hidden state h, with x = h rounded to int8
// per block of 32 (dequantized: x_i = d_b q_i) and w's dequantized values w_i = s_b c_i,
//   y = fma chain over the nb blocks of float(D_b) * fl(s_b d_b),  D_b = sum_i c_i q_i exact,
// so |y - w.x| <= gamma_{nb+1} sum_i |w_i x_i| <= gamma_{nb+1} |w| |x|, gamma_n = n u / (1 - n u),
// u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., sec. 3.1). Stage 1
// computes the cluster score s_c with the same formula on the Q8_0 centroid c (dequantized), so
// for every row w of cluster c:
//   y_w <= w.x + gamma |w| |x| = c.x + (w - c).x + gamma |w| |x|
//       <= s_c + (R_c + gamma (N_c + |c|)) |x|
// with R_c >= max_w |w - c| (the bound radius) and N_c >= max_w |w| (Cauchy-Schwarz twice).
// A candidate logit L* strictly above every unprobed cluster's bound is the dense argmax's.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::head {

/// What a cluster's bound needs, float32 rounded up from float64 (image tensors
/// flashhead.bound_radii and flashhead.bound_norms).
struct ClusterBounds {
  std::vector<float> radius;  // [n_clusters]: max over the cluster's rows of |row - centroid|_2
  std::vector<float> norm;    // [n_clusters]: max over its rows of |row|_2, plus |centroid|_2
};

/// The bounds of clusters of `cluster_size` consecutive rows of `head` (Q8_0 [V, d], rows in
/// cluster order) around `centroids` (Q8_0 [V / cluster_size, d]), both dequantized exactly,
/// distances summed in float64. Throws kestrel::Error for other types or shapes that differ.
ClusterBounds compute_cluster_bounds(const kernels::Matrix& head, const kernels::Matrix& centroids,
                                     size_t cluster_size, ThreadPool& pool);

/// Which terms the bound keeps. Both, always, outside the mutation tests that show each one is
/// needed (tests/image/test_flashhead.cpp).
struct BoundTerms {
  bool radius = true;    // R_c |x|
  bool rounding = true;  // gamma (N_c + |c|) |x|, and the float64 evaluation's own slack
};

/// An upper bound on |x|_2 for token t of `x` (its int8 values times their block scales),
/// summed in float64 and rounded up.
double activation_norm_bound(const kernels::Q8Activations& x, size_t t);

/// gamma_{nb+1} for rows of `cols` columns (nb = cols / 32 blocks): the relative rounding bound
/// of the fma chain above.
double rounding_gamma(size_t cols);

/// ub[k] = the bound on every row of cluster k given its stage-1 score scores[k] (float32, the
/// centroid's product alone, without stage 1's optimistic radius term) for k < scores.size().
/// `x_norm`: activation_norm_bound; `gamma`: rounding_gamma. NaN scores give NaN bounds (which
/// never certify).
void cluster_upper_bounds(std::span<const float> scores, const float* radius, const float* norm, double x_norm,
                          double gamma, const BoundTerms& terms, double* ub);

}  // namespace kestrel::head
