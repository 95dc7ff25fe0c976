#include "kestrel/head/flashhead.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>

#include "kestrel/base/error.h"
#include "kestrel/head/best_clusters.h"
#include "kestrel/head/flashhead_format.h"
#include "kestrel/kernels/gemv_q8_rows.h"
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
  // Stage 1 reads the interleaved copy alone: the stored centroids leave the resident set.
  file.release(*c);
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
  load_proof_data(file);
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

void FlashHead::load_proof_data(const gguf::File& file) {
  const gguf::TensorInfo* r = file.find_tensor(kBoundRadiiTensor);
  const gguf::TensorInfo* n = file.find_tensor(kBoundNormsTensor);
  const auto version = file.has(keys::kBoundVersion) ? file.get_uint(keys::kBoundVersion) : 0;
  if (r == nullptr || n == nullptr || version == 0) {
    proof_status_ = "unavailable: the image has no bound data (built before the greedy proof; rebuild it with kestrel build --flashhead)";
    return;
  }
  if (version != keys::kCurrentBoundVersion) {
    proof_status_ = "unavailable: the image's bound data is version " + std::to_string(version) + ", this build reads " +
                    std::to_string(keys::kCurrentBoundVersion);
    return;
  }
  for (const gguf::TensorInfo* t : {r, n}) {
    if (t->type != gguf::TensorType::kF32 || t->shape != std::vector<uint64_t>{n_clusters_}) {
      throw Error("FlashHead: image tensor " + t->name + " must be F32 {" + std::to_string(n_clusters_) + "}");
    }
  }
  bound_radii_ = reinterpret_cast<const float*>(file.tensor_data(*r).data());
  bound_norms_ = reinterpret_cast<const float*>(file.tensor_data(*n).data());
  for (size_t k = 0; k < n_clusters_; ++k) {
    if (!(bound_radii_[k] >= 0.0f) || !(bound_norms_[k] >= 0.0f) || !std::isfinite(bound_radii_[k]) ||
        !std::isfinite(bound_norms_[k])) {
      throw Error("FlashHead: the bound data of cluster " + std::to_string(k) + " is not finite and >= 0 (corrupt image)");
    }
  }
  const kernels::Matrix& w = head_->weight;
  if (w.type != kernels::WeightType::kQ8_0 || !w.int8_rows) {
    proof_status_ = "unavailable: the head does not run Q8_0 rows with int8 activations (the arithmetic the bound covers; "
                    "--decode-act bf16 or a CPU without AVX2)";
    return;
  }
  if (head_->final_softcap > 0.0f) {
    proof_status_ = "unavailable: the model soft-caps its logits (the bound covers the raw products)";
    return;
  }
  proof_available_ = true;
}

ProofStats FlashHead::proof_stats() const {
  ProofStats s;
  s.searches = n_searches_.load(std::memory_order_relaxed);
  s.clusters = n_clusters_scored_.load(std::memory_order_relaxed);
  s.floor = n_floor_.load(std::memory_order_relaxed);
  s.extra = n_extra_.load(std::memory_order_relaxed);
  s.dense = n_dense_.load(std::memory_order_relaxed);
  s.none = n_none_.load(std::memory_order_relaxed);
  return s;
}

void FlashHead::count(const Candidates& c) const {
  n_searches_.fetch_add(1, std::memory_order_relaxed);
  n_clusters_scored_.fetch_add(c.clusters, std::memory_order_relaxed);
  switch (c.proof) {
    case Proof::kNone: n_none_.fetch_add(1, std::memory_order_relaxed); break;
    case Proof::kFloor: n_floor_.fetch_add(1, std::memory_order_relaxed); break;
    case Proof::kExtra: n_extra_.fetch_add(1, std::memory_order_relaxed); break;
    case Proof::kDense: n_dense_.fetch_add(1, std::memory_order_relaxed); break;
  }
}

void FlashHead::cluster_scores(const float* hidden, float* scores, ThreadPool& pool) const {
  stage1(hidden, 1, scores, pool);
}

void FlashHead::stage1(const float* x, size_t n_rows, float* scores, ThreadPool& pool, float* raw) const {
  thread_local kernels::Q8Activations xq;
  const size_t d = centroids_.cols;
  kernels::quantize_q8_activations(x, n_rows, d, d, xq);
  const kernels::Q8Activations& q = xq;  // this thread's, for the pool's threads
  pool.parallel_for(centroids_il_.padded_rows() / 16, 1, [&](size_t b, size_t e) {
    kernels::gemv_q8_interleaved(centroids_il_, q, scores, n_clusters_, b * 16, std::min(e * 16, n_clusters_));
  });
  if (raw != nullptr) std::copy_n(scores, n_rows * n_clusters_, raw);
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

// The proof's state of one row of a batch.
struct RowProof {
  std::vector<uint8_t> probed;    // [n_clusters]: 1 once scored
  std::vector<uint32_t> doubt;    // unprobed clusters whose bound reaches the best logit
  std::vector<uint32_t> extra;    // the clusters this round adds, ascending
  std::vector<TokenId> singles;   // special tokens scored alone (their cluster not probed at first)
  size_t first_extra = 0;         // where the added clusters' logits begin in the output
  float best = 0;                 // the best candidate logit so far
  bool done = false;
};

struct Scratch {
  std::vector<float> x, scores, raw;
  std::vector<double> ub;
  kernels::Q8Activations xq;  // x rounded to int8 for stage 2, where the head takes int8 activations
  std::vector<std::vector<uint32_t>> probed;
  std::vector<Piece> pieces, run, merged;
  std::vector<Group> groups;
  std::vector<RowProof> proof;
};

// This thread's buffers, kept between calls.
Scratch& this_thread_scratch() {
  thread_local Scratch s;
  return s;
}

bool piece_before(const Piece& a, const Piece& b) {
  return a.head_row < b.head_row || (a.head_row == b.head_row && a.row < b.row);
}

// Stage 2: scores `pieces` (sorted by piece_before) into their outputs (ids and logits at
// piece.at, already sized), with the dense head's arithmetic: int8 rows against xq where the
// head takes int8 activations, else float32 products against x [rows, d].
void score_pieces(const OutputHead& head, const std::vector<Piece>& pieces, std::vector<Group>& groups,
                  const float* x, const kernels::Q8Activations& xq, std::span<Candidates* const> out,
                  ThreadPool& pool) {
  const size_t d = head.weight.cols;
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
  const size_t row_bytes = head.weight.row_bytes();
  const bool int8 = head.weight.int8_rows;
  pool.parallel_for_dynamic(groups.size(), kGroupsPerClaim, [&](size_t b, size_t e) {
    thread_local std::vector<float> xs, ys;
    for (size_t g = b; g < e; ++g) {
      if (g + kPrefetchGroups < e) {
        const Piece& ahead = pieces[groups[g + kPrefetchGroups].first];
        const uint8_t* bytes = head.weight.row(ahead.head_row);
        for (size_t at = 0; at < ahead.count * row_bytes; at += 64) __builtin_prefetch(bytes + at);
      }
      const Group& group = groups[g];
      const Piece& first = pieces[group.first];
      const size_t count = first.count;
      const kernels::Matrix slice = kernels::row_slice(head.weight, first.head_row, count);
      if (int8) {
        // A Q8_0 head: up to kRowsTokensMax of the group's rows at a time, the cluster's blocks
        // and scales read once for them (the same bits as one at a time); an INT4 head (built
        // with --embedding int4): each piece alone, the group's rows staying in L1 for the next.
        const size_t step = slice.type == kernels::WeightType::kQ8_0 ? kernels::kRowsTokensMax : 1;
        for (size_t j0 = 0; j0 < group.n; j0 += step) {
          const size_t m = std::min(step, group.n - j0);
          size_t tokens[kernels::kRowsTokensMax];
          float* outs[kernels::kRowsTokensMax];
          for (size_t j = 0; j < m; ++j) {
            const Piece& piece = pieces[group.first + j0 + j];
            tokens[j] = piece.row;
            outs[j] = &out[piece.row]->logits[piece.at];
          }
          if (step > 1) {
            kernels::gemv_q8_rows_tokens(slice, xq, std::span(tokens, m), std::span(outs, m), 0, count);
          } else {
            kernels::gemv_int8_rows(slice, xq, tokens[0], tokens[0] + 1, outs[0], count, 0, count);
          }
          for (size_t j = 0; j < m; ++j) {
            const Piece& piece = pieces[group.first + j0 + j];
            apply_softcap(outs[j], count, head.final_softcap);
            copy_small(&head.row_tokens[piece.head_row], count, &out[piece.row]->ids[piece.at]);
          }
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
      apply_softcap(y, group.n * count, head.final_softcap);
      for (size_t j = 0; j < group.n; ++j) {
        const Piece& piece = pieces[group.first + j];
        Candidates& c = *out[piece.row];
        if (group.n > 1) copy_small(&ys[j * count], count, &c.logits[piece.at]);
        copy_small(&head.row_tokens[piece.head_row], count, &c.ids[piece.at]);
      }
    }
  });
}

// The largest of n logits (NaN when one is NaN: a NaN best never certifies).
float max_logit(const float* y, size_t n, float best) {
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(y[i])) return y[i];
    best = std::max(best, y[i]);
  }
  return best;
}

// Clusters probed per proof round (best bound first), then every cluster.
constexpr size_t kRoundClusters[] = {16, 64, 256, 1024};

}  // namespace

void FlashHead::search_batch(std::span<const float* const> hidden, size_t probes,
                             std::span<Candidates* const> out, ThreadPool& pool) const {
  if (hidden.size() != out.size()) throw Error("FlashHead: hidden states and outputs differ in number");
  const size_t n_rows = hidden.size(), cap = cluster_size_, d = head_->weight.cols;
  if (n_rows == 0) return;
  probes = std::clamp<size_t>(probes, 1, n_clusters_);
  const bool prove = proves();
  // Scratch kept between calls (a decode step allocates nothing here once warm). The lambdas
  // below run on the pool's threads: they must see this thread's buffers, hence the references
  // (a thread_local named inside a lambda would be the running thread's own).
  Scratch& scratch = this_thread_scratch();
  auto& x = scratch.x;
  auto& scores = scratch.scores;
  auto& probed = scratch.probed;
  auto& pieces = scratch.pieces;
  x.resize(n_rows * d);
  if (probed.size() < n_rows) probed.resize(n_rows);
  for (size_t i = 0; i < n_rows; ++i) std::copy_n(hidden[i], d, &x[i * d]);
  // Stage 1: every row's cluster scores in one product, then each row's best `probes`, in
  // memory order for stage 2 (the rows' selections in parallel).
  if (probes < n_clusters_) {
    scores.resize(n_rows * n_clusters_);
    if (prove) scratch.raw.resize(n_rows * n_clusters_);
    stage1(x.data(), n_rows, scores.data(), pool, prove ? scratch.raw.data() : nullptr);
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
  // Each row's pieces form a run in head-row order (its clusters are sorted; the few special
  // tokens are sorted in); the runs merge into `pieces` through `merged` (std::merge into kept
  // buffers: no allocation once warm, unlike std::inplace_merge's temporary buffer).
  auto& run = scratch.run;
  auto& merged = scratch.merged;
  auto& proof = scratch.proof;
  if (prove && proof.size() < n_rows) proof.resize(n_rows);
  pieces.clear();
  for (size_t i = 0; i < n_rows; ++i) {
    run.clear();
    size_t n = 0;
    for (uint32_t k : probed[i]) {
      run.push_back({k * cap, cap, i, n});
      n += cap;
    }
    const size_t specials = run.size();
    if (prove) proof[i].singles.clear();
    for (TokenId t : special_) {
      const size_t row = head_->row_of(t);
      if (!std::binary_search(probed[i].begin(), probed[i].end(), static_cast<uint32_t>(row / cap))) {
        run.push_back({row, 1, i, n});
        n += 1;
        if (prove) proof[i].singles.push_back(t);
      }
    }
    if (run.size() > specials) {
      const auto mid = run.begin() + static_cast<std::ptrdiff_t>(specials);
      std::sort(mid, run.end(), piece_before);
      merged.resize(run.size());
      std::merge(run.begin(), mid, mid, run.end(), merged.begin(), piece_before);
      run.swap(merged);
    }
    merged.resize(pieces.size() + run.size());
    std::merge(pieces.begin(), pieces.end(), run.begin(), run.end(), merged.begin(), piece_before);
    pieces.swap(merged);
    out[i]->ids.resize(n);
    out[i]->logits.resize(n);
    out[i]->clusters = probed[i].size();
    out[i]->proof = prove ? Proof::kFloor : Proof::kNone;
  }
  // A head that takes int8 activations (its dense products do too: kernels::Matrix::int8_rows)
  // scores each piece from the rows as stored, the hidden states rounded once for all pieces.
  auto& xq = scratch.xq;
  if (head_->weight.int8_rows) kernels::quantize_q8_activations(x.data(), n_rows, d, d, xq);
  score_pieces(*head_, pieces, scratch.groups, x.data(), xq, out, pool);
  if (prove && probes < n_clusters_) certify(n_rows, out, pool);
  for (size_t i = 0; i < n_rows; ++i) count(*out[i]);
}

void FlashHead::certify(size_t n_rows, std::span<Candidates* const> out, ThreadPool& pool) const {
  // The greedy proof (flashhead_bound.h): each row's unprobed clusters whose bound is not
  // strictly below its best logit are probed, best bound first, until none is left.
  Scratch& s = this_thread_scratch();
  const size_t k_all = n_clusters_, cap = cluster_size_;
  const double gamma = rounding_gamma(head_->weight.cols);
  s.ub.resize(n_rows * k_all);
  for (size_t i = 0; i < n_rows; ++i) {
    RowProof& p = s.proof[i];
    p.probed.assign(k_all, 0);
    for (uint32_t k : s.probed[i]) p.probed[k] = 1;
    const double x_norm = activation_norm_bound(s.xq, i);
    cluster_upper_bounds({&s.raw[i * k_all], k_all}, bound_radii_, bound_norms_, x_norm, gamma, terms_,
                         &s.ub[i * k_all]);
    p.best = max_logit(out[i]->logits.data(), out[i]->size(), -std::numeric_limits<float>::infinity());
    p.first_extra = out[i]->size();
    p.done = false;
  }
  auto& pieces = s.pieces;
  for (size_t round = 0;; ++round) {
    pieces.clear();
    for (size_t i = 0; i < n_rows; ++i) {
      RowProof& p = s.proof[i];
      if (p.done) continue;
      const double* ub = &s.ub[i * k_all];
      const double best = p.best;
      p.doubt.clear();
      for (size_t k = 0; k < k_all; ++k) {
        if (!p.probed[k] && !(ub[k] < best)) p.doubt.push_back(static_cast<uint32_t>(k));
      }
      if (p.doubt.empty()) {
        p.done = true;
        continue;
      }
      Candidates& c = *out[i];
      p.extra.clear();
      if (round >= std::size(kRoundClusters) || p.doubt.size() > k_all / 4) {
        for (size_t k = 0; k < k_all; ++k) {
          if (!p.probed[k]) p.extra.push_back(static_cast<uint32_t>(k));
        }
        c.proof = Proof::kDense;
      } else {
        const size_t n = std::min(kRoundClusters[round], p.doubt.size());
        const auto by_bound = [ub](uint32_t a, uint32_t b) { return ub[a] > ub[b] || (ub[a] == ub[b] && a < b); };
        std::partial_sort(p.doubt.begin(), p.doubt.begin() + static_cast<std::ptrdiff_t>(n), p.doubt.end(), by_bound);
        p.extra.assign(p.doubt.begin(), p.doubt.begin() + static_cast<std::ptrdiff_t>(n));
        std::sort(p.extra.begin(), p.extra.end());
        c.proof = Proof::kExtra;
      }
      size_t at = c.size();
      for (uint32_t k : p.extra) {
        pieces.push_back({k * cap, cap, i, at});
        at += cap;
        p.probed[k] = 1;
      }
      c.ids.resize(at);
      c.logits.resize(at);
      c.clusters += p.extra.size();
    }
    if (pieces.empty()) break;
    std::sort(pieces.begin(), pieces.end(), piece_before);
    score_pieces(*head_, pieces, s.groups, s.x.data(), s.xq, out, pool);
    for (size_t i = 0; i < n_rows; ++i) {
      RowProof& p = s.proof[i];
      if (p.done || p.extra.empty()) continue;
      const Candidates& c = *out[i];
      const size_t added = p.extra.size() * cap;
      p.best = max_logit(&c.logits[c.size() - added], added, p.best);
      p.extra.clear();
    }
  }
  // A special token scored alone whose cluster a round then probed is in the output twice: keep
  // the first.
  for (size_t i = 0; i < n_rows; ++i) {
    RowProof& p = s.proof[i];
    Candidates& c = *out[i];
    if (p.singles.empty() || p.first_extra == c.size()) continue;
    size_t w = p.first_extra;
    for (size_t r = p.first_extra; r < c.size(); ++r) {
      if (std::find(p.singles.begin(), p.singles.end(), c.ids[r]) != p.singles.end()) continue;
      c.ids[w] = c.ids[r];
      c.logits[w] = c.logits[r];
      ++w;
    }
    c.ids.resize(w);
    c.logits.resize(w);
  }
}

size_t FlashHead::load_copy_bytes() const {
  return centroids_il_.codes.size() * sizeof(centroids_il_.codes[0]) +
         centroids_il_.scales.size() * sizeof(centroids_il_.scales[0]);
}

size_t FlashHead::search_bytes(size_t probes) const {
  return centroids_.bytes() + (radii_ != nullptr ? n_clusters_ * sizeof(float) : 0) + search_row_bytes(probes);
}

size_t FlashHead::search_row_bytes(size_t probes) const {
  const kernels::Matrix& w = head_->weight;
  const size_t row = w.rows > 0 ? w.bytes() / w.rows : 0;
  return (std::clamp<size_t>(probes, 1, n_clusters_) * cluster_size_ + special_.size()) * row;
}

}  // namespace kestrel::head
