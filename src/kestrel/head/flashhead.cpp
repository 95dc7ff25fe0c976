#include "kestrel/head/flashhead.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kestrel/base/error.h"
#include "kestrel/head/flashhead_format.h"

namespace kestrel::head {

TokenId greedy(const Candidates& c) {
  if (c.ids.empty()) throw Error("FlashHead: no candidates");
  size_t best = 0;
  for (size_t i = 1; i < c.ids.size(); ++i) {
    if (c.logits[i] > c.logits[best] || (c.logits[i] == c.logits[best] && c.ids[i] < c.ids[best])) best = i;
  }
  return c.ids[best];
}

bool FlashHead::present(const gguf::File& file) {
  return file.find_tensor(kCentroidsTensor) != nullptr;
}

FlashHead::FlashHead(const gguf::File& file, const OutputHead& head) : head_(&head) {
  const size_t v = head.n_vocab(), d = head.weight.cols;
  cluster_size_ = static_cast<size_t>(file.get_uint(keys::kClusterSize));
  n_clusters_ = static_cast<size_t>(file.get_uint(keys::kClusters));
  default_probes_ = static_cast<size_t>(file.get_uint(keys::kProbes));
  if (cluster_size_ == 0 || n_clusters_ * cluster_size_ != v) {
    throw Error("FlashHead: " + std::to_string(n_clusters_) + " clusters of " + std::to_string(cluster_size_) +
                " do not cover the vocabulary of " + std::to_string(v));
  }
  if (head.row_tokens.size() != v) throw Error("FlashHead: the image's head rows are not in cluster order");
  if (default_probes_ == 0 || default_probes_ > n_clusters_) {
    throw Error("FlashHead: default probes " + std::to_string(default_probes_) + " outside 1.." +
                std::to_string(n_clusters_));
  }
  const gguf::TensorInfo* c = file.find_tensor(kCentroidsTensor);
  if (c == nullptr || c->type != gguf::TensorType::kQ8_0 || c->shape != std::vector<uint64_t>{d, n_clusters_}) {
    throw Error(std::string("FlashHead: image tensor ") + kCentroidsTensor + " must be Q8_0 {" +
                std::to_string(d) + ", " + std::to_string(n_clusters_) + "}");
  }
  centroids_.type = kernels::WeightType::kQ8_0;
  centroids_.data = file.tensor_data(*c).data();
  centroids_.rows = n_clusters_;
  centroids_.cols = d;
  // A non-finite centroid scale would rank clusters by NaN: refuse the image instead.
  const auto* blocks = static_cast<const uint8_t*>(centroids_.data);
  for (size_t b = 0; b < n_clusters_ * d / 32; ++b) {
    uint16_t scale = 0;
    std::memcpy(&scale, blocks + b * 34, sizeof(scale));
    if ((scale & 0x7C00) == 0x7C00) throw Error("FlashHead: a centroid scale is not finite (corrupt image)");
  }
  if (const gguf::TensorInfo* r = file.find_tensor(kRadiiTensor)) {
    if (r->type != gguf::TensorType::kF32 || r->shape != std::vector<uint64_t>{n_clusters_}) {
      throw Error(std::string("FlashHead: image tensor ") + kRadiiTensor + " must be F32 {" +
                  std::to_string(n_clusters_) + "}");
    }
    radii_ = reinterpret_cast<const float*>(file.tensor_data(*r).data());
    radius_weight_ = static_cast<float>(file.find_float(keys::kRadiusWeight).value_or(0.0));
    if (!std::isfinite(radius_weight_) || radius_weight_ < 0.0f) {
      throw Error("FlashHead: the image's radius weight is not a finite number >= 0");
    }
    for (size_t k = 0; k < n_clusters_; ++k) {
      if (!std::isfinite(radii_[k]) || radii_[k] < 0.0f) throw Error("FlashHead: cluster radius " + std::to_string(k) + " is not a finite number >= 0");
    }
  }
  if (const gguf::TensorInfo* s = file.find_tensor(kSpecialTokensTensor)) {
    if (s->type != gguf::TensorType::kI32 || s->shape.size() != 1) {
      throw Error(std::string("FlashHead: image tensor ") + kSpecialTokensTensor + " must be 1-D I32");
    }
    const auto* ids = reinterpret_cast<const TokenId*>(file.tensor_data(*s).data());
    for (size_t i = 0; i < s->shape[0]; ++i) {
      if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= v) throw Error("FlashHead: special token id out of range");
      special_.push_back(ids[i]);
    }
  }
}

void FlashHead::cluster_scores(const float* hidden, float* scores, ThreadPool& pool) const {
  kernels::matmul(centroids_, hidden, 1, centroids_.cols, scores, n_clusters_, pool);
  if (radii_ != nullptr && radius_weight_ != 0.0f) {
    double norm2 = 0;
    for (size_t j = 0; j < centroids_.cols; ++j) norm2 += static_cast<double>(hidden[j]) * hidden[j];
    const float a = radius_weight_ * static_cast<float>(std::sqrt(norm2));
    for (size_t k = 0; k < n_clusters_; ++k) scores[k] += a * radii_[k];
  }
}

void FlashHead::search(const float* hidden, size_t probes, Candidates& out, ThreadPool& pool) const {
  probes = std::clamp<size_t>(probes, 1, n_clusters_);
  const size_t cap = cluster_size_, d = head_->weight.cols;
  std::vector<uint32_t> probed(n_clusters_);
  std::iota(probed.begin(), probed.end(), 0u);
  if (probes < n_clusters_) {
    std::vector<float> scores(n_clusters_);
    cluster_scores(hidden, scores.data(), pool);
    std::nth_element(probed.begin(), probed.begin() + static_cast<std::ptrdiff_t>(probes), probed.end(),
                     [&](uint32_t a, uint32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
    probed.resize(probes);
    std::sort(probed.begin(), probed.end());  // memory order for stage 2
  }
  // Runs of consecutive head rows to score: probed clusters (adjacent ones merged), then the
  // special tokens whose cluster was not probed. Output position = position in this order.
  struct Run {
    size_t row, count, at;
  };
  std::vector<Run> runs;
  size_t n = 0;
  auto add_rows = [&](size_t row, size_t count) {
    if (!runs.empty() && runs.back().row + runs.back().count == row) {
      runs.back().count += count;
    } else {
      runs.push_back({row, count, n});
    }
    n += count;
  };
  for (uint32_t k : probed) add_rows(k * cap, cap);
  for (TokenId t : special_) {
    const size_t row = head_->row_of(t);
    if (!std::binary_search(probed.begin(), probed.end(), static_cast<uint32_t>(row / cap))) add_rows(row, 1);
  }
  out.ids.resize(n);
  out.logits.resize(n);
  pool.parallel_for(n, 64, [&](size_t b, size_t e) {
    // The first run that ends after b.
    auto it = std::upper_bound(runs.begin(), runs.end(), b, [](size_t pos, const Run& r) { return pos < r.at + r.count; });
    for (; it != runs.end() && it->at < e; ++it) {
      const size_t from = std::max(b, it->at), to = std::min(e, it->at + it->count);
      const size_t row0 = it->row + (from - it->at), rows = to - from;
      const kernels::Matrix slice = kernels::row_slice(head_->weight, row0, rows);
      kernels::matmul_rows(slice, hidden, 1, d, &out.logits[from], rows, 0, rows);
      for (size_t i = 0; i < rows; ++i) out.ids[from + i] = head_->row_tokens[row0 + i];
    }
    apply_softcap(&out.logits[b], e - b, head_->final_softcap);
  });
}

}  // namespace kestrel::head
