#include "kestrel/quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::quant {
namespace {

// In-place lower Cholesky factor of the symmetric positive definite a [n, n] (double).
// Returns false if a pivot is not positive.
bool cholesky(std::vector<double>& a, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    double diag = a[j * n + j];
    for (size_t k = 0; k < j; ++k) diag -= a[j * n + k] * a[j * n + k];
    if (!(diag > 0.0)) return false;
    const double l = std::sqrt(diag);
    a[j * n + j] = l;
    for (size_t i = j + 1; i < n; ++i) {
      double v = a[i * n + j];
      const double* ri = &a[i * n];
      const double* rj = &a[j * n];
      for (size_t k = 0; k < j; ++k) v -= ri[k] * rj[k];
      a[i * n + j] = v / l;
    }
    for (size_t k = j + 1; k < n; ++k) a[j * n + k] = 0.0;
  }
  return true;
}

// H^-1 from its lower Cholesky factor L (H = L L^T): H^-1 = L^-T L^-1.
std::vector<double> inverse_from_cholesky(const std::vector<double>& l, size_t n) {
  // Li = L^-1 (lower), column by column of the identity.
  std::vector<double> li(n * n, 0.0);
  for (size_t c = 0; c < n; ++c) {
    for (size_t i = c; i < n; ++i) {
      double v = i == c ? 1.0 : 0.0;
      for (size_t k = c; k < i; ++k) v -= l[i * n + k] * li[k * n + c];
      li[i * n + c] = v / l[i * n + i];
    }
  }
  std::vector<double> inv(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      double v = 0.0;
      for (size_t k = i; k < n; ++k) v += li[k * n + i] * li[k * n + j];
      inv[i * n + j] = v;
      inv[j * n + i] = v;
    }
  }
  return inv;
}

}  // namespace

W4Matrix quantize_w4_gptq(const float* w, size_t rows, size_t cols, size_t group_size, const float* x, size_t n,
                          double damp, ThreadPool& pool) {
  if (group_size == 0 || group_size % 32 != 0 || cols % group_size != 0) {
    throw Error("INT4 group size " + std::to_string(group_size) + " must be a multiple of 32 that divides the row length " +
                std::to_string(cols));
  }
  if (n == 0 || x == nullptr) throw Error("GPTQ needs input rows");
  // H = X^T X / n as a matmul: the "weights" are X^T [cols, n], the "tokens" its rows.
  std::vector<float> xt(cols * n);
  for (size_t t = 0; t < n; ++t) {
    for (size_t i = 0; i < cols; ++i) xt[i * n + t] = x[t * cols + i];
  }
  std::vector<float> hf(cols * cols);
  kernels::Matrix xm;
  xm.type = kernels::WeightType::kF32;
  xm.data = xt.data();
  xm.rows = cols;
  xm.cols = n;
  kernels::matmul(xm, xt.data(), cols, n, hf.data(), cols, pool);
  std::vector<double> h(cols * cols);
  double mean_diag = 0.0;
  for (size_t i = 0; i < cols * cols; ++i) h[i] = static_cast<double>(hf[i]) / static_cast<double>(n);
  std::vector<bool> dead(cols, false);
  for (size_t i = 0; i < cols; ++i) mean_diag += h[i * cols + i] / static_cast<double>(cols);
  if (!(mean_diag > 0.0)) mean_diag = 1.0;
  std::vector<float> diag(cols);
  for (size_t i = 0; i < cols; ++i) {
    if (h[i * cols + i] <= 0.0) {
      dead[i] = true;
      for (size_t j = 0; j < cols; ++j) h[i * cols + j] = h[j * cols + i] = 0.0;
      h[i * cols + i] = mean_diag;
    }
    diag[i] = static_cast<float>(h[i * cols + i]);
    h[i * cols + i] += damp * mean_diag;
  }
  if (!cholesky(h, cols)) throw Error("GPTQ: the input second moments are not positive definite");
  std::vector<double> inv = inverse_from_cholesky(h, cols);
  if (!cholesky(inv, cols)) throw Error("GPTQ: the inverse second moments are not positive definite");
  // U = (lower factor of H^-1)^T, upper: U[i][j] = inv[j][i] for j >= i.
  std::vector<float> u(cols * cols, 0.0f);
  for (size_t i = 0; i < cols; ++i) {
    for (size_t j = i; j < cols; ++j) u[i * cols + j] = static_cast<float>(inv[j * cols + i]);
  }
  inv.clear();
  h.clear();

  W4Matrix q;
  q.rows = rows;
  q.cols = cols;
  q.group_size = group_size;
  q.qs.assign(rows * cols / 2, 0);
  const size_t n_groups = cols / group_size;
  q.scales.resize(rows * n_groups);
  q.mins.resize(rows * n_groups);
  const size_t half = group_size / 2;
  pool.parallel_for(rows, 8, [&](size_t begin, size_t end) {
    std::vector<float> wr(cols);
    std::vector<uint8_t> codes(cols);
    for (size_t r = begin; r < end; ++r) {
      std::copy(w + r * cols, w + (r + 1) * cols, wr.begin());
      float d = 0, m = 0;
      for (size_t i = 0; i < cols; ++i) {
        if (i % group_size == 0) {
          const size_t g = i / group_size;
          uint16_t d16 = 0, m16 = 0;
          fit_affine_group(&wr[i], &diag[i], group_size, d16, m16);
          q.scales[r * n_groups + g] = d16;
          q.mins[r * n_groups + g] = m16;
          d = gguf::fp16_to_fp32(d16);
          m = gguf::fp16_to_fp32(m16);
        }
        const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
        const float code = std::clamp(std::nearbyint((wr[i] - m) * inv_d), 0.0f, 15.0f);
        codes[i] = static_cast<uint8_t>(code);
        if (dead[i]) continue;
        const float err = (wr[i] - (d * code + m)) / u[i * cols + i];
        const float* ui = &u[i * cols];
        for (size_t j = i + 1; j < cols; ++j) wr[j] -= err * ui[j];
      }
      for (size_t g = 0; g < n_groups; ++g) {
        uint8_t* out = &q.qs[(r * cols + g * group_size) / 2];
        const uint8_t* c = &codes[g * group_size];
        for (size_t j = 0; j < half; ++j) out[j] = static_cast<uint8_t>(c[j] | (c[j + half] << 4));
      }
    }
  });
  return q;
}

}  // namespace kestrel::quant
