// FlashHead at run time: the two-stage retrieval head (Embedl, arXiv 2603.14591; docs/flashhead.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/head/output_head.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::head {

/// A sparse set of logits: the tokens FlashHead scored, every other token's logit being -inf.
struct Candidates {
  std::vector<TokenId> ids;   // token ids, distinct
  std::vector<float> logits;  // float32, soft-capped like the dense head's, same order as ids
  size_t size() const { return ids.size(); }
  void clear() {
    ids.clear();
    logits.clear();
  }
};

/// The token with the largest logit among the candidates, the lowest id on ties (what argmax
/// over the dense logits returns when the dense argmax is a candidate). Candidates not empty.
TokenId greedy(const Candidates& candidates);

class FlashHead {
 public:
  /// Reads the FlashHead tensors and keys of an image built with --flashhead. `head` is the
  /// model's output head (rows in cluster order) and must outlive this. Throws kestrel::Error
  /// when they are missing or inconsistent with the head.
  FlashHead(const gguf::File& file, const OutputHead& head);

  /// True when `file` carries FlashHead data.
  static bool present(const gguf::File& file);

  size_t cluster_size() const { return cluster_size_; }
  size_t n_clusters() const { return n_clusters_; }
  size_t default_probes() const { return default_probes_; }
  const std::vector<TokenId>& special_tokens() const { return special_; }

  /// Scores one hidden state (float32 [d_model], after the output norm).
  /// Stage 1: s_k = centroid_k . h + alpha |h| radius_k for every cluster (centroid = mean
  /// row, radius = the largest distance of a member row from it, alpha = the image's radius
  /// weight: an optimistic estimate of the cluster's best logit rather than its mean; the dot
  /// product with h rounded to int8 per block of 32, kernels/gemv_q8_interleaved.h, since stage 1
  /// only ranks clusters), keeping
  /// the `probes` best (partial selection; ties to the lower cluster). Stage 2: exact logits, with the dense head's
  /// arithmetic and soft-cap, of every token in those clusters and of the special tokens.
  /// probes is clamped to [1, n_clusters]; probes == n_clusters gives the dense head's logits
  /// bit for bit. Writes `out` (cleared first).
  void search(const float* hidden, size_t probes, Candidates& out, ThreadPool& pool) const;

  /// search() of several hidden states at once (the rows of a batched decode step or of a
  /// speculative verification): out[i] is bit-identical to search(hidden[i], probes, *out[i]).
  /// Stage 1 is one product of the centroids with every row (the centroids are read once, not
  /// once per row), and stage 2 scores the clusters in memory order, the rows that probed a
  /// cluster one after another, so a cluster probed by several rows is read once. hidden and
  /// out have the same size; out's pointers distinct.
  void search_batch(std::span<const float* const> hidden, size_t probes, std::span<Candidates* const> out,
                    ThreadPool& pool) const;

  /// Bytes one search(hidden, probes) reads: the centroids (and radii), then the head rows of the
  /// probed clusters and of the special tokens (probes clamped as search clamps it).
  size_t search_bytes(size_t probes) const;

  /// Stage 1 only: the cluster scores float32 [n_clusters] (for sampling and evaluation).
  void cluster_scores(const float* hidden, float* scores, ThreadPool& pool) const;

 private:
  /// scores[k] += alpha |h| radius_k (stage 1's optimistic term; nothing without radii).
  void add_radius_term(const float* hidden, float* scores) const;

  const OutputHead* head_;
  /// The scores of every cluster for n_rows hidden states x (float32 [n_rows, d_model]) into
  /// scores[n_rows, n_clusters], radius term included (stage 1's arithmetic, one place).
  void stage1(const float* x, size_t n_rows, float* scores, ThreadPool& pool) const;

  kernels::Matrix centroids_;  // Q8_0 [n_clusters, d_model]
  kernels::Q8Interleaved centroids_il_;  // the same, interleaved for stage 1 (gemv_q8_interleaved.h)
  size_t cluster_size_ = 0, n_clusters_ = 0, default_probes_ = 0;
  std::vector<TokenId> special_;
  const float* radii_ = nullptr;  // [n_clusters] or null
  float radius_weight_ = 0.0f;
};

}  // namespace kestrel::head
