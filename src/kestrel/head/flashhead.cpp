#include "kestrel/head/flashhead.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kestrel/base/error.h"
#include "kestrel/head/best_clusters.h"
#include "kestrel/head/flashhead_format.h"
#include "kestrel/kernels/gemv_w4_rows.h"

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
  centroids_il_ = kernels::interleave_q8_0(centroids_);
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
  stage1(hidden, 1, scores, pool);
}

void FlashHead::stage1(const float* x, size_t n_rows, float* scores, ThreadPool& pool) const {
  thread_local kernels::Q8Activations xq;
  const size_t d = centroids_.cols;
  kernels::quantize_q8_activations(x, n_rows, d, d, xq);
  const kernels::Q8Activations& q = xq;  // this thread's, for the pool's threads
  pool.parallel_for(centroids_il_.padded_rows() / 16, 1, [&](size_t b, size_t e) {
    kernels::gemv_q8_interleaved(centroids_il_, q, scores, n_clusters_, b * 16, std::min(e * 16, n_clusters_));
  });
  for (size_t i = 0; i < n_rows; ++i) add_radius_term(x + i * d, scores + i * n_clusters_);
}

void FlashHead::add_radius_term(const float* hidden, float* scores) const {
  if (radii_ == nullptr || radius_weight_ == 0.0f) return;
  double norm2 = 0;
  for (size_t j = 0; j < centroids_.cols; ++j) norm2 += static_cast<double>(hidden[j]) * hidden[j];
  const float a = radius_weight_ * static_cast<float>(std::sqrt(norm2));
  for (size_t k = 0; k < n_clusters_; ++k) scores[k] += a * radii_[k];
}

void FlashHead::search(const float* hidden, size_t probes, Candidates& out, ThreadPool& pool) const {
  const float* const rows[] = {hidden};
  Candidates* const outs[] = {&out};
  search_batch(rows, probes, outs, pool);
}

namespace {

// search_batch's buffers. Piece: head rows [head_row, head_row + count) scored for `row` into
// its output at `at`. Group: pieces [first, first + n) of the same head rows.
struct Piece {
  size_t head_row, count, row, at;
};
struct Group {
  size_t first, n;
};
// n elements from src to dst; a cluster of 16 (the images' size) as one fixed-size copy the
// compiler inlines (a library memmove call per 64 bytes showed in the profile of a batched step).
template <class T>
inline void copy_small(const T* src, size_t n, T* dst) {
  if (n == 16) {
    std::memcpy(dst, src, 16 * sizeof(T));
  } else {
    std::copy_n(src, n, dst);
  }
}

struct Scratch {
  std::vector<float> x, scores;
  kernels::Q8Activations xq;  // x rounded to int8 for stage 2, where the head takes int8 activations
  std::vector<std::vector<uint32_t>> probed;
  std::vector<Piece> pieces, run, merged;
  std::vector<Group> groups;
};

}  // namespace

void FlashHead::search_batch(std::span<const float* const> hidden, size_t probes,
                             std::span<Candidates* const> out, ThreadPool& pool) const {
  if (hidden.size() != out.size()) throw Error("FlashHead: hidden states and outputs differ in number");
  const size_t n_rows = hidden.size(), cap = cluster_size_, d = head_->weight.cols;
  if (n_rows == 0) return;
  probes = std::clamp<size_t>(probes, 1, n_clusters_);
  // Scratch kept between calls (a decode step allocates nothing here once warm). The lambdas
  // below run on the pool's threads: they must see this thread's buffers, hence the references
  // (a thread_local named inside a lambda would be the running thread's own).
  thread_local Scratch scratch;
  auto& x = scratch.x;
  auto& scores = scratch.scores;
  auto& probed = scratch.probed;
  auto& pieces = scratch.pieces;
  auto& groups = scratch.groups;
  x.resize(n_rows * d);
  if (probed.size() < n_rows) probed.resize(n_rows);
  for (size_t i = 0; i < n_rows; ++i) std::copy_n(hidden[i], d, &x[i * d]);
  // Stage 1: every row's cluster scores in one product, then each row's best `probes`, in
  // memory order for stage 2 (the rows' selections in parallel).
  if (probes < n_clusters_) {
    scores.resize(n_rows * n_clusters_);
    stage1(x.data(), n_rows, scores.data(), pool);
    pool.parallel_for(n_rows, 1, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) best_indices(&scores[i * n_clusters_], n_clusters_, probes, probed[i]);
    });
  } else {
    for (size_t i = 0; i < n_rows; ++i) {
      probed[i].resize(n_clusters_);
      std::iota(probed[i].begin(), probed[i].end(), 0u);
    }
  }
  // Stage 2. A row's output order: its probed clusters in memory order, then the special tokens
  // whose cluster it did not probe. The pieces to score: (head rows, row, output position),
  // sorted by head row so that the rows probing one cluster score it one after another.
  const auto before = [](const Piece& a, const Piece& b) {
    return a.head_row < b.head_row || (a.head_row == b.head_row && a.row < b.row);
  };
  // Each row's pieces form a run in head-row order (its clusters are sorted; the few special
  // tokens are sorted in); the runs merge into `pieces` through `merged` (std::merge into kept
  // buffers: no allocation once warm, unlike std::inplace_merge's temporary buffer).
  auto& run = scratch.run;
  auto& merged = scratch.merged;
  pieces.clear();
  for (size_t i = 0; i < n_rows; ++i) {
    run.clear();
    size_t n = 0;
    for (uint32_t k : probed[i]) {
      run.push_back({k * cap, cap, i, n});
      n += cap;
    }
    const size_t specials = run.size();
    for (TokenId t : special_) {
      const size_t row = head_->row_of(t);
      if (!std::binary_search(probed[i].begin(), probed[i].end(), static_cast<uint32_t>(row / cap))) {
        run.push_back({row, 1, i, n});
        n += 1;
      }
    }
    if (run.size() > specials) {
      const auto mid = run.begin() + static_cast<std::ptrdiff_t>(specials);
      std::sort(mid, run.end(), before);
      merged.resize(run.size());
      std::merge(run.begin(), mid, mid, run.end(), merged.begin(), before);
      run.swap(merged);
    }
    merged.resize(pieces.size() + run.size());
    std::merge(pieces.begin(), pieces.end(), run.begin(), run.end(), merged.begin(), before);
    pieces.swap(merged);
    out[i]->ids.resize(n);
    out[i]->logits.resize(n);
  }
  // Pieces of the same head rows (rows of the step probing the same cluster: the drafted tokens
  // of one sequence mostly do) are scored together: each Q8_0 row is dequantized once for all of
  // them, with each product bit-identical to scoring it alone (kernels::matmul).
  groups.clear();
  for (size_t p = 0; p < pieces.size(); ++p) {
    if (!groups.empty() && pieces[groups.back().first].head_row == pieces[p].head_row &&
        pieces[groups.back().first].count == pieces[p].count) {
      ++groups.back().n;
    } else {
      groups.push_back({p, 1});
    }
  }
  // The probed clusters lie scattered over the head (~11 KB each for Gemma 3 270M): reading
  // them one after another leaves the core waiting on DRAM at every new cluster, so the rows of
  // the group kPrefetchGroups ahead are requested while this one is scored.
  constexpr size_t kPrefetchGroups = 2;
  // Clusters cost unequal time (DRAM latency varies), so the threads claim runs of groups as
  // they become free rather than taking fixed halves.
  constexpr size_t kGroupsPerClaim = 32;
  const size_t row_bytes = head_->weight.row_bytes();
  // A head that takes int8 activations (its dense products do too: kernels::Matrix::int8_rows)
  // scores each piece from the rows as stored, the hidden states rounded once for all pieces.
  const bool int8 = head_->weight.int8_rows;
  auto& xq = scratch.xq;
  if (int8) kernels::quantize_q8_activations(x.data(), n_rows, d, d, xq);
  pool.parallel_for_dynamic(groups.size(), kGroupsPerClaim, [&](size_t b, size_t e) {
    thread_local std::vector<float> xs, ys;
    for (size_t g = b; g < e; ++g) {
      if (g + kPrefetchGroups < e) {
        const Piece& ahead = pieces[groups[g + kPrefetchGroups].first];
        const uint8_t* bytes = head_->weight.row(ahead.head_row);
        for (size_t at = 0; at < ahead.count * row_bytes; at += 64) __builtin_prefetch(bytes + at);
      }
      const Group& group = groups[g];
      const Piece& first = pieces[group.first];
      const size_t count = first.count;
      const kernels::Matrix slice = kernels::row_slice(head_->weight, first.head_row, count);
      if (int8) {  // each piece alone: the group's rows stay in L1 for the next
        for (size_t j = 0; j < group.n; ++j) {
          const Piece& piece = pieces[group.first + j];
          Candidates& c = *out[piece.row];
          float* y = &c.logits[piece.at];
          kernels::gemv_int8_rows(slice, xq, piece.row, piece.row + 1, y, count, 0, count);
          apply_softcap(y, count, head_->final_softcap);
          copy_small(&head_->row_tokens[piece.head_row], count, &c.ids[piece.at]);
        }
        continue;
      }
      // One row alone reads its hidden state in place; several are gathered.
      const float* in = &x[first.row * d];
      if (group.n > 1) {
        xs.resize(group.n * d);
        for (size_t j = 0; j < group.n; ++j) std::copy_n(&x[pieces[group.first + j].row * d], d, &xs[j * d]);
        in = xs.data();
      }
      // One row writes its logits in place; several go through ys, then to their outputs.
      float* y = &out[first.row]->logits[first.at];
      if (group.n > 1) {
        ys.resize(group.n * count);
        y = ys.data();
      }
      kernels::matmul_rows(slice, in, group.n, d, y, count, 0, count);
      apply_softcap(y, group.n * count, head_->final_softcap);
      for (size_t j = 0; j < group.n; ++j) {
        const Piece& piece = pieces[group.first + j];
        Candidates& c = *out[piece.row];
        if (group.n > 1) copy_small(&ys[j * count], count, &c.logits[piece.at]);
        copy_small(&head_->row_tokens[piece.head_row], count, &c.ids[piece.at]);
      }
    }
  });
}

size_t FlashHead::search_bytes(size_t probes) const {
  const kernels::Matrix& w = head_->weight;
  const size_t row = w.rows > 0 ? w.bytes() / w.rows : 0;
  const size_t rows = std::clamp<size_t>(probes, 1, n_clusters_) * cluster_size_ + special_.size();
  return centroids_.bytes() + (radii_ != nullptr ? n_clusters_ * sizeof(float) : 0) + rows * row;
}

}  // namespace kestrel::head
