// FlashHead at run time: the two-stage retrieval head (Embedl, arXiv 2603.14591; docs/flashhead.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/head/flashhead_bound.h"
#include "kestrel/head/output_head.h"
#include "kestrel/kernels/gemv_q8_interleaved.h"
#include "kestrel/kernels/matmul.h"

namespace kestrel::head {

/// How a search's greedy token is known to be the dense head's (docs/flashhead.md, "The greedy proof").
enum class Proof : uint8_t {
  kNone,   // no proof: the image has no bound data, the head's arithmetic is not the bounded one,
           // or the proof is switched off (FlashHead::set_proof)
  kFloor,  // proven with the requested probes alone
  kExtra,  // proven after probing more clusters (those whose bound still reached the best logit)
  kDense,  // too many clusters left: every cluster scored (the dense head's logits, bit for bit)
};

/// A sparse set of logits: the tokens FlashHead scored, every other token's logit being -inf.
struct Candidates {
  std::vector<TokenId> ids;   // token ids, distinct
  std::vector<float> logits;  // float32, soft-capped like the dense head's, same order as ids
  size_t clusters = 0;        // clusters scored (the probes, plus those the proof added)
  Proof proof = Proof::kNone;
  size_t size() const { return ids.size(); }
  void clear() {
    ids.clear();
    logits.clear();
    clusters = 0;
    proof = Proof::kNone;
  }
};

/// Counts of searched hidden states by how their greedy token was proven (FlashHead::proof_stats).
struct ProofStats {
  uint64_t searches = 0;        // hidden states searched
  uint64_t clusters = 0;        // clusters scored, summed over them
  uint64_t floor = 0, extra = 0, dense = 0, none = 0;  // by Proof
  ProofStats operator-(const ProofStats& o) const {
    return {searches - o.searches, clusters - o.clusters, floor - o.floor, extra - o.extra, dense - o.dense,
            none - o.none};
  }
  double mean_clusters() const { return searches ? static_cast<double>(clusters) / static_cast<double>(searches) : 0; }
  double pct(uint64_t n) const { return searches ? 100.0 * static_cast<double>(n) / static_cast<double>(searches) : 0; }
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

  /// Whether searches prove their greedy token (docs/flashhead.md, "The greedy proof"): the
  /// image carries the bound data (kestrel.flashhead.bound_version 1), the head is Q8_0 with
  /// int8 activations (the arithmetic bounded, head/flashhead_bound.h), it has no final soft-cap,
  /// and set_proof switched it on. proof_status() says which in words.
  bool proves() const { return proof_available_ && proof_on_; }
  bool proof_available() const { return proof_available_; }
  std::string proof_status() const {
    return !proof_available_ ? proof_status_ : proof_on_ ? "on" : "off (available: --flashhead-proof on)";
  }
  /// Switches the proof on or off (the default: the fixed probes alone, as images without bound
  /// data run). Off by default because today's bound almost never certifies with the image's
  /// probes alone, so a proven search scores every cluster (docs/flashhead.md, measurements).
  void set_proof(bool on) { proof_on_ = on; }
  /// The bound's terms; BoundTerms{} always, outside the mutation tests that drop one.
  void set_bound_terms(const BoundTerms& terms) { terms_ = terms; }
  /// Counts over every search so far (thread-safe; subtract two snapshots for an interval).
  ProofStats proof_stats() const;

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

  /// With the proof (proves()), every search then certifies its greedy token: each unprobed
  /// cluster's upper bound on the dense head's logit of its rows (head/flashhead_bound.h) must
  /// lie strictly below the best candidate logit; clusters whose bound does not are probed too,
  /// best bound first in rounds of 16, 64, 256, 1,024 clusters, and when more than a quarter of
  /// the clusters remain in doubt (or after those rounds) every cluster is scored. The greedy
  /// token (greedy()) is then the dense head's argmax, ties to the lower id included.
  /// out.clusters and out.proof say what it took. `probes` is the floor.
  ///
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
  /// The part of search_bytes that is a row's own in a batched search (search_batch): the head
  /// rows of its probed clusters and special tokens. The centroids are read once for all rows;
  /// rows that probe the same cluster share its reading too, so this is the most a row adds.
  size_t search_row_bytes(size_t probes) const;

  /// Bytes of the copy made at load: the centroids interleaved for stage 1 (the stored ones'
  /// pages leave the resident set).
  size_t load_copy_bytes() const;

  /// Stage 1 only: the cluster scores float32 [n_clusters] (for sampling and evaluation).
  void cluster_scores(const float* hidden, float* scores, ThreadPool& pool) const;

 private:
  /// scores[k] += alpha |h| radius_k (stage 1's optimistic term; nothing without radii).
  void add_radius_term(const float* hidden, float* scores) const;
  void count(const Candidates& c) const;
  /// The greedy proof's rounds after stage 2 (this thread's search_batch buffers).
  void certify(size_t n_rows, std::span<Candidates* const> out, ThreadPool& pool) const;
  /// Reads the proof's tensors and decides proof_available_ / proof_status_.
  void load_proof_data(const gguf::File& file);

  const OutputHead* head_;
  /// The scores of every cluster for n_rows hidden states x (float32 [n_rows, d_model]) into
  /// scores[n_rows, n_clusters], radius term included (stage 1's arithmetic, one place).
  /// raw (float32 [n_rows, n_clusters] or null): the centroid products alone, for the proof.
  void stage1(const float* x, size_t n_rows, float* scores, ThreadPool& pool, float* raw = nullptr) const;

  kernels::Matrix centroids_;  // Q8_0 [n_clusters, d_model]
  kernels::Q8Interleaved centroids_il_;  // the same, interleaved for stage 1 (gemv_q8_interleaved.h)
  size_t cluster_size_ = 0, n_clusters_ = 0, default_probes_ = 0;
  std::vector<TokenId> special_;
  const float* radii_ = nullptr;  // [n_clusters] or null
  float radius_weight_ = 0.0f;
  // The proof's data (flashhead_bound.h): [n_clusters] each, or null.
  const float* bound_radii_ = nullptr;
  const float* bound_norms_ = nullptr;
  bool proof_available_ = false, proof_on_ = false;
  std::string proof_status_;
  BoundTerms terms_;
  mutable std::atomic<uint64_t> n_searches_{0}, n_clusters_scored_{0}, n_floor_{0}, n_extra_{0}, n_dense_{0},
      n_none_{0};
};

}  // namespace kestrel::head
