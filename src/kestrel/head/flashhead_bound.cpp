#include "kestrel/head/flashhead_bound.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"

namespace kestrel::head {

namespace {

constexpr size_t kBlock = 32;
constexpr size_t kBlockBytes = 34;  // fp16 scale + 32 int8 codes

// Row r of a Q8_0 matrix, dequantized exactly (an fp16 scale times an int8 is exact in float64).
void dequantize_row(const kernels::Matrix& m, size_t r, double* out) {
  const uint8_t* row = m.row(r);
  for (size_t b = 0; b < m.cols / kBlock; ++b) {
    uint16_t half = 0;
    std::memcpy(&half, row + b * kBlockBytes, sizeof(half));
    const double s = gguf::fp16_to_fp32(half);
    const auto* q = reinterpret_cast<const int8_t*>(row + b * kBlockBytes + 2);
    for (size_t i = 0; i < kBlock; ++i) out[b * kBlock + i] = s * q[i];
  }
}

// float64 -> float32, never below the value (the bounds must stay upper bounds).
float round_up(double v) {
  float f = static_cast<float>(v);
  if (static_cast<double>(f) < v) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}

// Relative slack for a float64 sum of n non-negative terms and a square root (n u_64 with room).
double sum_slack(size_t n) { return static_cast<double>(n + 4) * std::ldexp(1.0, -52); }

}  // namespace

ClusterBounds compute_cluster_bounds(const kernels::Matrix& head, const kernels::Matrix& centroids,
                                     size_t cluster_size, ThreadPool& pool) {
  if (head.type != kernels::WeightType::kQ8_0 || centroids.type != kernels::WeightType::kQ8_0) {
    throw Error("FlashHead bounds: the head and the centroids must be Q8_0");
  }
  if (head.cols != centroids.cols || head.cols % kBlock != 0 || cluster_size == 0 ||
      centroids.rows * cluster_size != head.rows) {
    throw Error("FlashHead bounds: " + std::to_string(centroids.rows) + " clusters of " + std::to_string(cluster_size) +
                " do not match a head of " + std::to_string(head.rows) + " rows");
  }
  const size_t d = head.cols, k = centroids.rows;
  ClusterBounds out;
  out.radius.resize(k);
  out.norm.resize(k);
  const double slack = 1.0 + sum_slack(d);
  pool.parallel_for(k, 64, [&](size_t b, size_t e) {
    std::vector<double> c(d), w(d);
    for (size_t ci = b; ci < e; ++ci) {
      dequantize_row(centroids, ci, c.data());
      double c2 = 0, r2 = 0, n2 = 0;
      for (size_t j = 0; j < d; ++j) c2 += c[j] * c[j];
      for (size_t r = ci * cluster_size; r < (ci + 1) * cluster_size; ++r) {
        dequantize_row(head, r, w.data());
        double dist = 0, norm = 0;
        for (size_t j = 0; j < d; ++j) {
          const double diff = w[j] - c[j];
          dist += diff * diff;
          norm += w[j] * w[j];
        }
        r2 = std::max(r2, dist);
        n2 = std::max(n2, norm);
      }
      out.radius[ci] = round_up(std::sqrt(r2) * slack);
      out.norm[ci] = round_up((std::sqrt(n2) + std::sqrt(c2)) * slack);
    }
  });
  return out;
}

double activation_norm_bound(const kernels::Q8Activations& x, size_t t) {
  if (t >= x.n_tokens) throw Error("activation_norm_bound: token past the activations");
  const size_t nb = x.cols / kBlock;
  double sum = 0;
  for (size_t b = 0; b < nb; ++b) {
    const double s = x.scale[t * nb + b];
    const int8_t* q = &x.q[t * x.cols + b * kBlock];
    int64_t q2 = 0;  // exact
    for (size_t i = 0; i < kBlock; ++i) q2 += static_cast<int64_t>(q[i]) * q[i];
    sum += s * s * static_cast<double>(q2);
  }
  return std::sqrt(sum) * (1.0 + sum_slack(nb + 2));
}

double rounding_gamma(size_t cols) {
  const double n = static_cast<double>(cols / kBlock + 1), u = std::ldexp(1.0, -24);
  return n * u / (1.0 - n * u);
}

void cluster_upper_bounds(std::span<const float> scores, const float* radius, const float* norm, double x_norm,
                          double gamma, const BoundTerms& terms, double* ub) {
  // Underflow in the float32 products (subnormal block scales) adds at most ~2^-149 per step:
  // 1e-30 covers it many times over. The float64 evaluation below errs by a few 2^-53 of the
  // magnitudes summed: 1e-12 of them covers it.
  constexpr double kTiny = 1e-30, kEval = 1e-12;
  for (size_t k = 0; k < scores.size(); ++k) {
    const double s = scores[k];
    double extra = 0;
    if (terms.radius) extra += static_cast<double>(radius[k]) * x_norm;
    if (terms.rounding) extra += gamma * static_cast<double>(norm[k]) * x_norm;
    double v = s + extra;
    if (terms.rounding) v += kEval * (std::fabs(s) + extra) + kTiny;
    ub[k] = v;
  }
}

}  // namespace kestrel::head
