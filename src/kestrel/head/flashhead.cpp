#include "kestrel/head/flashhead.h"

#include <algorithm>
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
  // Special tokens whose cluster was not probed get a row of their own.
  std::vector<size_t> extra_rows;
  for (TokenId t : special_) {
    const size_t row = head_->row_of(t);
    if (!std::binary_search(probed.begin(), probed.end(), static_cast<uint32_t>(row / cap))) {
      extra_rows.push_back(row);
    }
  }
  const size_t n = probes * cap + extra_rows.size();
  out.ids.resize(n);
  out.logits.resize(n);
  pool.parallel_for(probes + extra_rows.size(), 8, [&](size_t b, size_t e) {
    for (size_t p = b; p < e; ++p) {
      const size_t row0 = p < probes ? probed[p] * cap : extra_rows[p - probes];
      const size_t rows = p < probes ? cap : 1;
      const size_t at = p < probes ? p * cap : probes * cap + (p - probes);
      const kernels::Matrix slice = kernels::row_slice(head_->weight, row0, rows);
      kernels::matmul_rows(slice, hidden, 1, d, &out.logits[at], rows, 0, rows);
      for (size_t i = 0; i < rows; ++i) out.ids[at + i] = head_->row_tokens[row0 + i];
      apply_softcap(&out.logits[at], rows, head_->final_softcap);
    }
  });
}

}  // namespace kestrel::head
