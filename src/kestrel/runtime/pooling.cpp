#include "kestrel/runtime/pooling.h"

#include <cmath>

#include "kestrel/base/error.h"

namespace kestrel::runtime {

Pooling parse_pooling(const std::string& name) {
  if (name == "none") return Pooling::kNone;
  if (name == "mean") return Pooling::kMean;
  if (name == "last") return Pooling::kLast;
  if (name == "cls") return Pooling::kCls;
  throw Error("pooling '" + name + "': expected mean, last or cls");
}

const char* pooling_name(Pooling pooling) {
  switch (pooling) {
    case Pooling::kMean: return "mean";
    case Pooling::kLast: return "last";
    case Pooling::kCls: return "cls";
    case Pooling::kNone: break;
  }
  return "none";
}

HiddenPool::HiddenPool(Pooling pooling, size_t d_model) : pooling_(pooling), d_(d_model), acc_(d_model, 0.0) {
  if (pooling == Pooling::kNone) throw Error("HiddenPool: no pooling");
  if (d_model == 0) throw Error("HiddenPool: d_model is 0");
}

void HiddenPool::add(const float* rows, size_t n) {
  if (n == 0) return;
  switch (pooling_) {
    case Pooling::kMean:
      for (size_t t = 0; t < n; ++t) {
        for (size_t i = 0; i < d_; ++i) acc_[i] += rows[t * d_ + i];
      }
      break;
    case Pooling::kLast:
      for (size_t i = 0; i < d_; ++i) acc_[i] = rows[(n - 1) * d_ + i];
      break;
    case Pooling::kCls:
      if (tokens_ == 0) {
        for (size_t i = 0; i < d_; ++i) acc_[i] = rows[i];
      }
      break;
    case Pooling::kNone:
      break;
  }
  tokens_ += n;
}

std::vector<float> HiddenPool::finish() const {
  if (tokens_ == 0) throw Error("HiddenPool: no hidden rows were pooled");
  double norm2 = 0;
  for (const double v : acc_) norm2 += v * v;
  // The mean's 1/n cancels in the normalization; it matters only for a zero vector.
  const double scale = norm2 > 0 ? 1.0 / std::sqrt(norm2) : 0.0;
  std::vector<float> out(d_);
  for (size_t i = 0; i < d_; ++i) out[i] = static_cast<float>(acc_[i] * scale);
  return out;
}

}  // namespace kestrel::runtime
