#include "kestrel/quant/w4.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"

namespace kestrel::quant {
namespace {

constexpr float kDivisors[] = {-8.0f, -7.75f, -7.5f, -7.25f, -7.0f, -6.75f, -6.5f,
                               6.5f,  6.75f,  7.0f,  7.25f,  7.5f};

uint8_t quantize_one(float w, float inv_d) {
  const float q = std::nearbyint(w * inv_d) + 8.0f;
  return static_cast<uint8_t>(std::clamp(q, 0.0f, 15.0f));
}

// Quantizes one group; returns the fp16 scale and writes group_size / 2 packed bytes.
uint16_t quantize_group(const float* w, const float* importance, size_t n, uint8_t* out) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(w[i]) > std::fabs(m)) m = w[i];
  }
  uint16_t best_bits = 0;
  double best_err = INFINITY;
  for (float c : kDivisors) {
    const uint16_t bits = gguf::fp32_to_fp16(m / c);
    const float d = gguf::fp16_to_fp32(bits);  // quantize against the scale actually stored
    const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
    double err = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const float deq = d * static_cast<float>(quantize_one(w[i], inv_d) - 8);
      const double e = static_cast<double>(w[i] - deq);
      err += (importance ? importance[i] : 1.0f) * e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_bits = bits;
    }
  }
  const float d = gguf::fp16_to_fp32(best_bits);
  const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
  const size_t half = n / 2;
  for (size_t j = 0; j < half; ++j) {
    out[j] = static_cast<uint8_t>(quantize_one(w[j], inv_d) | (quantize_one(w[j + half], inv_d) << 4));
  }
  return best_bits;
}

struct Affine {
  uint16_t d, m;
};

// A quantizing thread's code buffers for one group (reused: no allocation per group).
struct GroupCodes {
  std::vector<uint8_t> q, prev, best, scratch;
};
GroupCodes& group_codes(size_t n) {
  thread_local GroupCodes codes;
  for (auto* v : {&codes.q, &codes.prev, &codes.best, &codes.scratch}) v->assign(n, 0);
  return codes;
}

// Packs a group's n codes (one per byte) into n / 2 bytes: byte j holds code j in its low
// nibble and code j + n / 2 in its high one (the kW4 layout, kernels/matmul.h).
void pack_group(const uint8_t* codes, size_t n, uint8_t* out) {
  for (size_t j = 0; j < n / 2; ++j) out[j] = static_cast<uint8_t>(codes[j] | (codes[j + n / 2] << 4));
}

// std::clamp(std::nearbyint(x), 0.0f, 15.0f), bit for bit, without a call: the bounds being
// integers, clamping first gives the same code, and for 0 <= x <= 15 adding and subtracting
// 1.5 * 2^23 rounds to the nearest integer, ties to even, as nearbyint does in the default
// rounding mode (the baseline x86-64 build has no SSE4.1 `roundss`: nearbyintf was a libm call
// per weight per try).
inline float round_code(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float c = std::clamp(x, 0.0f, 15.0f);
  return (c + kMagic) - kMagic;
}

// Squared error of the group with stored (fp16) d and m; writes the codes to q.
double affine_error(const float* w, const float* importance, size_t n, float d, float m,
                    uint8_t* q) {
  const float inv_d = d != 0.0f ? 1.0f / d : 0.0f;
  double err = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const float code = round_code((w[i] - m) * inv_d);
    q[i] = static_cast<uint8_t>(code);
    const double e = static_cast<double>(w[i] - (d * code + m));
    err += (importance ? importance[i] : 1.0f) * e * e;
  }
  return err;
}

// The weighted least-squares (d, m) of w ~ d * q + m for fixed codes q (weights `importance`,
// or 1); nullopt when the codes do not determine it (all equal).
struct LeastSquares {
  double d, m;
};
std::optional<LeastSquares> least_squares_fit(const float* w, const float* importance, const uint8_t* q, size_t n) {
  double s = 0, sq = 0, sqq = 0, sw = 0, sqw = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = importance ? importance[i] : 1.0, qi = q[i];
    s += a;
    sq += a * qi;
    sqq += a * qi * qi;
    sw += a * w[i];
    sqw += a * qi * w[i];
  }
  const double det = s * sqq - sq * sq;
  if (det <= 0) return std::nullopt;
  return LeastSquares{(s * sqw - sq * sw) / det, (sqq * sw - sq * sqw) / det};
}

Affine quantize_group_affine(const float* w, const float* importance, size_t n, uint8_t* out,
                             bool fast) {
  float lo = w[0], hi = w[0];
  for (size_t i = 1; i < n; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  GroupCodes& codes = group_codes(n);
  uint8_t *q = codes.q.data(), *prev = codes.prev.data(), *best_q = codes.best.data();
  Affine best{gguf::fp32_to_fp16((hi - lo) / 15.0f), gguf::fp32_to_fp16(lo)};
  double best_err = INFINITY;
  // Several starting grids (the range over 14..17 steps, as make_qkx2_quants' rdelta search),
  // each refined by alternating rounding and least squares.
  constexpr float kSteps[] = {15.0f, 14.0f, 14.5f, 15.5f, 16.0f, 17.0f};
  for (size_t grid = 0; grid < (fast ? 1 : std::size(kSteps)); ++grid) {
  const float steps = kSteps[grid];
  float d = (hi - lo) / steps, m = lo;
  for (int iter = 0; iter < 4; ++iter) {
    const Affine stored{gguf::fp32_to_fp16(d), gguf::fp32_to_fp16(m)};
    const double err = affine_error(w, importance, n, gguf::fp16_to_fp32(stored.d),
                                    gguf::fp16_to_fp32(stored.m), q);
    if (err < best_err) {
      best_err = err;
      best = stored;
      std::copy(q, q + n, best_q);
    }
    // The same codes as the last iteration: the fit below gives the (d, m) this iteration
    // started from, so every later iteration repeats this one. Stop (the result is unchanged).
    if (iter > 0 && std::equal(q, q + n, prev)) break;
    std::swap(q, prev);
    // Weighted least squares of w ~ d * q + m for the current codes (now in prev).
    const auto fit = least_squares_fit(w, importance, prev, n);
    if (!fit) break;
    d = static_cast<float>(fit->d);
    m = static_cast<float>(fit->m);
  }
  }
  pack_group(best_q, n, out);
  return best;
}

// quantize_group_affine with the minimum tied to an integer zero point (quantize_w4's
// integer_zero_points): m = integer_zero_point_min(d, z).
Affine quantize_group_int_zero(const float* w, const float* importance, size_t n, uint8_t* out,
                               bool fast) {
  float lo = w[0], hi = w[0];
  for (size_t i = 1; i < n; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  GroupCodes& codes = group_codes(n);
  uint8_t *q = codes.q.data(), *prev = codes.prev.data(), *best_q = codes.best.data(),
          *scratch = codes.scratch.data();
  Affine best{0, 0};
  double best_err = INFINITY;
  if (hi == 0.0f && lo == 0.0f) {  // an all-zero group: d = 0, z = 0
    pack_group(best_q, n, out);
    return best;
  }
  auto clamp_z = [](double z) { return static_cast<unsigned>(std::clamp(std::nearbyint(z), 0.0, 15.0)); };
  constexpr float kSteps[] = {15.0f, 14.0f, 14.5f, 15.5f, 16.0f, 17.0f};
  for (size_t grid = 0; grid < (fast ? 1 : std::size(kSteps)); ++grid) {
    double d = (hi - lo) / kSteps[grid];
    if (d <= 0.0) d = std::fabs(lo) / 8.0;  // a constant group
    unsigned z = clamp_z(-lo / d);
    for (int iter = 0; iter < 4; ++iter) {
      const uint16_t d16 = gguf::fp32_to_fp16(static_cast<float>(d));
      const float df = gguf::fp16_to_fp32(d16);
      if (!(df > 0.0f) || !std::isfinite(df)) break;
      const uint16_t m16 = integer_zero_point_min(d16, z);
      const double err = affine_error(w, importance, n, df, gguf::fp16_to_fp32(m16), q);
      if (err < best_err) {
        best_err = err;
        best = {d16, m16};
        std::copy(q, q + n, best_q);
      }
      // The same codes as the last iteration: the next (d, z) below, a function of the codes,
      // is the one this iteration started from, so every later iteration repeats this one.
      if (iter > 0 && std::equal(q, q + n, prev)) break;
      std::swap(q, prev);  // the codes are in prev from here on
      // Unconstrained weighted least squares of w ~ d * q + m gives z = round(-m / d); for it
      // and its two neighbours, the least-squares d of w ~ d * (q - z) is tried on the current
      // codes, and the best (re-rounded) pair is the next iterate.
      const auto fit = least_squares_fit(w, importance, prev, n);
      if (!fit) break;
      const double d_free = fit->d, m_free = fit->m;
      if (!(d_free > 0)) break;
      const unsigned z0 = clamp_z(-m_free / d_free);
      double next_err = INFINITY, next_d = 0;
      unsigned next_z = z0;
      for (const unsigned zc : {z0, z0 - 1, z0 + 1}) {
        if (zc > 15) continue;  // (z0 - 1 wraps for z0 = 0)
        double num = 0, den = 0;
        for (size_t i = 0; i < n; ++i) {
          const double a = importance ? importance[i] : 1.0, c = static_cast<double>(prev[i]) - zc;
          num += a * c * w[i];
          den += a * c * c;
        }
        if (den <= 0 || !(num / den > 0)) continue;
        const uint16_t dc16 = gguf::fp32_to_fp16(static_cast<float>(num / den));
        const double e = affine_error(w, importance, n, gguf::fp16_to_fp32(dc16),
                                      gguf::fp16_to_fp32(integer_zero_point_min(dc16, zc)), scratch);
        if (e < next_err) {
          next_err = e;
          next_d = num / den;
          next_z = zc;
        }
        if (e < best_err) {  // a candidate in its own right
          best_err = e;
          best = {dc16, integer_zero_point_min(dc16, zc)};
          std::copy(scratch, scratch + n, best_q);
        }
      }
      if (!(next_d > 0)) break;
      d = next_d;
      z = next_z;
    }
  }
  pack_group(best_q, n, out);
  return best;
}

}  // namespace

uint16_t integer_zero_point_min(uint16_t d, unsigned z) {
  if (z == 0) return 0;
  return gguf::fp32_to_fp16(-(gguf::fp16_to_fp32(d) * static_cast<float>(z)));
}

std::optional<unsigned> integer_zero_point(uint16_t d, uint16_t m) {
  const float df = gguf::fp16_to_fp32(d), mf = gguf::fp16_to_fp32(m);
  if (!std::isfinite(df) || !std::isfinite(mf)) return std::nullopt;
  if (df == 0.0f) return mf == 0.0f ? std::optional<unsigned>(0) : std::nullopt;
  const double z = std::nearbyint(-static_cast<double>(mf) / df);
  if (z < 0 || z > 15) return std::nullopt;
  const auto zi = static_cast<unsigned>(z);
  if (gguf::fp16_to_fp32(integer_zero_point_min(d, zi)) != mf) return std::nullopt;
  return zi;
}

kernels::Matrix W4Matrix::view() const {
  kernels::Matrix m;
  m.type = kernels::WeightType::kW4;
  m.data = qs.data();
  m.rows = rows;
  m.cols = cols;
  if (!scales8.empty()) {
    m.scales8 = scales8.data();
    m.mins8 = mins8.data();
    m.row_scales = row_scales.data();
  } else {
    m.scales = scales.data();
    m.mins = mins.empty() ? nullptr : mins.data();
  }
  m.group_size = group_size;
  return m;
}

W4Matrix quantize_w4(const float* w, size_t rows, size_t cols, size_t group_size,
                     const float* importance, bool zero_points, ThreadPool& pool, bool fast,
                     bool integer_zero_points) {
  if (group_size == 0 || group_size % 32 != 0 || cols % group_size != 0) {
    throw Error("INT4 group size " + std::to_string(group_size) +
                " must be a multiple of 32 that divides the row length " + std::to_string(cols));
  }
  W4Matrix q;
  q.rows = rows;
  q.cols = cols;
  q.group_size = group_size;
  q.qs.resize(rows * cols / 2);
  const size_t n_groups = cols / group_size;
  q.scales.resize(rows * n_groups);
  if (zero_points) q.mins.resize(rows * n_groups);
  pool.parallel_for(rows, 8, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      for (size_t g = 0; g < n_groups; ++g) {
        const size_t col = g * group_size;
        const float* wg = w + r * cols + col;
        const float* ig = importance ? importance + col : nullptr;
        uint8_t* out = &q.qs[(r * cols + col) / 2];
        if (zero_points) {
          const Affine a = integer_zero_points ? quantize_group_int_zero(wg, ig, group_size, out, fast)
                                               : quantize_group_affine(wg, ig, group_size, out, fast);
          q.scales[r * n_groups + g] = a.d;
          q.mins[r * n_groups + g] = a.m;
        } else {
          q.scales[r * n_groups + g] = quantize_group(wg, ig, group_size, out);
        }
      }
    }
  });
  return q;
}

namespace {

// compress_group_params for row r.
void compress_row(W4Matrix& q, const float* w_row, const float* importance, size_t r) {
  const size_t G = q.group_size, n_groups = q.cols / G;
  const uint16_t* d16 = &q.scales[r * n_groups];
  const uint16_t* m16 = &q.mins[r * n_groups];
  float d_max = 0.0f, neg_m_max = 0.0f;
  for (size_t g = 0; g < n_groups; ++g) {
    d_max = std::max(d_max, gguf::fp16_to_fp32(d16[g]));
    neg_m_max = std::max(neg_m_max, -gguf::fp16_to_fp32(m16[g]));
  }
  // The row scales as stored (fp16), so that s_g and n_g are rounded against what is read.
  const uint16_t d_row16 = gguf::fp32_to_fp16(d_max / 255.0f), m_row16 = gguf::fp32_to_fp16(neg_m_max / 255.0f);
  const float d_row = gguf::fp16_to_fp32(d_row16), m_row = gguf::fp16_to_fp32(m_row16);
  q.row_scales[2 * r] = d_row16;
  q.row_scales[2 * r + 1] = m_row16;
  std::vector<uint8_t> codes(G), best_codes(G);
  for (size_t g = 0; g < n_groups; ++g) {
    const float* wg = w_row + g * G;
    const float* ig = importance ? importance + g * G : nullptr;
    const float s = d_row > 0.0f ? std::max(0.0f, gguf::fp16_to_fp32(d16[g])) / d_row : 0.0f;
    const float n = m_row > 0.0f ? std::max(0.0f, -gguf::fp16_to_fp32(m16[g])) / m_row : 0.0f;
    double best_err = INFINITY;
    uint8_t best_s = 0, best_n = 0;
    for (const float sc : {std::floor(s), std::ceil(s)}) {
      for (const float nc : {std::floor(n), std::ceil(n)}) {
        const auto si = static_cast<uint8_t>(std::clamp(sc, 0.0f, 255.0f));
        const auto ni = static_cast<uint8_t>(std::clamp(nc, 0.0f, 255.0f));
        const double err = affine_error(wg, ig, G, d_row * si, -m_row * ni, codes.data());
        if (err < best_err) {
          best_err = err;
          best_s = si;
          best_n = ni;
          best_codes = codes;
        }
      }
    }
    q.scales8[r * n_groups + g] = best_s;
    q.mins8[r * n_groups + g] = best_n;
    uint8_t* out = &q.qs[(r * q.cols + g * G) / 2];
    pack_group(best_codes.data(), G, out);
  }
}

}  // namespace

void compress_group_params(W4Matrix& q, const float* w, const float* importance, ThreadPool& pool) {
  if (q.mins.empty()) {
    throw Error("8-bit group scales need affine groups (zero points): symmetric INT4 keeps fp16 scales");
  }
  if (!q.scales8.empty()) throw Error("INT4 group parameters are already at 8 bits");
  const size_t n_groups = q.cols / q.group_size;
  q.scales8.resize(q.rows * n_groups);
  q.mins8.resize(q.rows * n_groups);
  q.row_scales.resize(q.rows * 2);
  pool.parallel_for(q.rows, 8, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) compress_row(q, w + r * q.cols, importance, r);
  });
  q.scales.clear();
  q.scales.shrink_to_fit();
  q.mins.clear();
  q.mins.shrink_to_fit();
}

void fit_affine_group(const float* w, const float* importance, size_t n, uint16_t& d, uint16_t& m) {
  std::vector<uint8_t> packed(n / 2 + 1);
  const Affine a = quantize_group_affine(w, importance, n, packed.data(), false);
  d = a.d;
  m = a.m;
}

W4Groups quantize_w4_rows(gguf::TensorType type, std::span<const std::byte> data, size_t rows,
                          size_t cols, size_t group_size, const float* importance, bool zero_points,
                          size_t block_rows,
                          const std::function<void(std::span<const uint8_t>)>& write_codes,
                          ThreadPool& pool, int scale_bits, bool integer_zero_points) {
  if (integer_zero_points && (!zero_points || scale_bits != 16)) {
    throw Error("INT4 quantization: integer zero points need affine groups with fp16 scales");
  }
  if (scale_bits != 16 && (scale_bits != 8 || !zero_points)) {
    throw Error("INT4 quantization: group scales of " + std::to_string(scale_bits) +
                " bits (16, or 8 with zero points)");
  }
  if (block_rows == 0) throw Error("INT4 quantization: a block of rows must hold at least one row");
  if (!gguf::is_supported(type)) {
    throw Error(std::string("INT4 quantization: cannot read tensor type ") + gguf::tensor_type_name(type));
  }
  const size_t src_row = static_cast<size_t>(gguf::row_bytes(type, cols));
  if (data.size() != rows * src_row) {
    throw Error("INT4 quantization: " + std::to_string(data.size()) + " bytes for " + std::to_string(rows) +
                " rows of " + std::to_string(src_row) + " bytes");
  }
  W4Groups groups;
  std::vector<float> dense(std::min(block_rows, rows) * cols);
  for (size_t r = 0; r < rows; r += block_rows) {
    const size_t n_rows = std::min(block_rows, rows - r);
    gguf::dequantize(type, data.data() + r * src_row, dense.data(), n_rows * cols);
    W4Matrix q = quantize_w4(dense.data(), n_rows, cols, group_size, importance, zero_points, pool, false,
                             integer_zero_points);
    if (scale_bits == 8) compress_group_params(q, dense.data(), importance, pool);
    write_codes(q.qs);
    groups.scales.insert(groups.scales.end(), q.scales.begin(), q.scales.end());
    groups.mins.insert(groups.mins.end(), q.mins.begin(), q.mins.end());
    groups.scales8.insert(groups.scales8.end(), q.scales8.begin(), q.scales8.end());
    groups.mins8.insert(groups.mins8.end(), q.mins8.begin(), q.mins8.end());
    groups.row_scales.insert(groups.row_scales.end(), q.row_scales.begin(), q.row_scales.end());
  }
  return groups;
}

double w4_rms_error(const W4Matrix& q, const float* w) {
  std::vector<float> row(q.cols);
  const kernels::Matrix m = q.view();
  double sum = 0.0;
  for (size_t r = 0; r < q.rows; ++r) {
    kernels::matrix_row(m, r, row.data());
    for (size_t i = 0; i < q.cols; ++i) {
      const double e = static_cast<double>(row[i]) - w[r * q.cols + i];
      sum += e * e;
    }
  }
  return std::sqrt(sum / static_cast<double>(q.rows * q.cols));
}

}  // namespace kestrel::quant
