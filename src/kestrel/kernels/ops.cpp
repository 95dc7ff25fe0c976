// Highway implementation of the per-vector ops; compiled once per SIMD target.
#include "kestrel/kernels/ops.h"

#include <algorithm>
#include <cmath>

#include "kestrel/formats/dequant.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kestrel/kernels/ops.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kestrel::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float SumSquares(const float* x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto acc = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    acc = hn::MulAdd(v, v, acc);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

float DotF16(const float* q, const hwy::float16_t* k, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  auto acc = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    acc = hn::MulAdd(hn::LoadU(d, q + i), hn::PromoteTo(d, hn::LoadU(dh, k + i)), acc);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) s += q[i] * gguf::fp16_to_fp32(reinterpret_cast<const uint16_t*>(k)[i]);
  return s;
}

// out += w * v (fp16 v).
void AxpyF16(float w, const hwy::float16_t* v, float* out, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  const auto wv = hn::Set(d, w);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::MulAdd(wv, hn::PromoteTo(d, hn::LoadU(dh, v + i)), hn::LoadU(d, out + i)), d,
               out + i);
  }
  for (; i < n; ++i) out[i] += w * gguf::fp16_to_fp32(reinterpret_cast<const uint16_t*>(v)[i]);
}

void Attend(const float* q, const uint16_t* k, const uint16_t* v, size_t stride, size_t capacity,
            size_t head_dim, size_t pos_begin, size_t pos_end, float* scores, float* out) {
  const auto* kh = reinterpret_cast<const hwy::float16_t*>(k);
  const auto* vh = reinterpret_cast<const hwy::float16_t*>(v);
  const size_t n = pos_end - pos_begin;
  float max_score = -INFINITY;
  for (size_t j = 0; j < n; ++j) {
    const size_t slot = (pos_begin + j) % capacity;
    scores[j] = DotF16(q, kh + slot * stride, head_dim);
    max_score = std::max(max_score, scores[j]);
  }
  float sum = 0.0f;
  for (size_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  const float inv_sum = 1.0f / sum;
  for (size_t i = 0; i < head_dim; ++i) out[i] = 0.0f;
  for (size_t j = 0; j < n; ++j) {
    const size_t slot = (pos_begin + j) % capacity;
    AxpyF16(scores[j] * inv_sum, vh + slot * stride, out, head_dim);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kestrel::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kestrel::kernels {

HWY_EXPORT(SumSquares);
HWY_EXPORT(Attend);

void rms_norm(const float* x, const float* weight, float* y, size_t n, float eps) {
  const float mean = HWY_DYNAMIC_DISPATCH(SumSquares)(x, n) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(mean + eps);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * inv * weight[i];
}

void rms_norm_unweighted(const float* x, float* y, size_t n, float eps) {
  const float mean = HWY_DYNAMIC_DISPATCH(SumSquares)(x, n) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(mean + eps);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * inv;
}

void gelu_tanh_mul(const float* gate, const float* up, float* y, size_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCoef = 0.044715f;
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float gelu = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * g * (1.0f + kCoef * g * g)));
    y[i] = gelu * up[i];
  }
}

void add_inplace(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] *= s;
}

void rope_neox(float* x, size_t n_heads, size_t head_dim, size_t n_rot, const float* cos_sin) {
  const size_t half = n_rot / 2;
  for (size_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (size_t i = 0; i < half; ++i) {
      const float c = cos_sin[2 * i];
      const float s = cos_sin[2 * i + 1];
      const float a = v[i];
      const float b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = a * s + b * c;
    }
  }
}

void to_fp16(const float* x, uint16_t* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = gguf::fp32_to_fp16(x[i]);
}

void attend(const float* q, const uint16_t* k, const uint16_t* v, size_t stride, size_t capacity,
            size_t head_dim, size_t pos_begin, size_t pos_end, float* scores, float* out) {
  HWY_DYNAMIC_DISPATCH(Attend)(q, k, v, stride, capacity, head_dim, pos_begin, pos_end, scores,
                               out);
}

}  // namespace kestrel::kernels
#endif  // HWY_ONCE
