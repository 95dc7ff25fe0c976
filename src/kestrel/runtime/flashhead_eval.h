// Teacher-forced comparison of FlashHead with the dense head it replaces (kestrel flashhead-eval).
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/sampler.h"

namespace kestrel::runtime {

struct FlashHeadEvalOptions {
  std::vector<size_t> probes;  // probe counts to sweep; empty: the image's default
  size_t n_ctx = 512;          // tokens per chunk, each from an empty KV cache (BOS first)
  size_t max_positions = 4096; // positions scored at most
  /// Sampling settings whose distributions are compared (total-variation distance); a
  /// temperature <= 0 skips the comparison.
  SamplerConfig sampler;
  /// The p of the top-p nucleus whose coverage is measured (ProbeResult::top_p_cover_pct), in
  /// [0, 1]: the dense softmax at temperature 1, unaffected by `sampler`. 0 skips the measurement
  /// (a softmax over the vocabulary and a ranking per position: ~5 ms each for 262,144 tokens).
  double top_p_cover = 0.95;
  /// true: the dense head scores each position alone and is timed (dense_head_ms). false: it
  /// scores up to kernels::kTileMinTokens - 1 positions per call, reading its weights once for
  /// all of them; the logits are the same, bit for bit (the matmuls compute each row of so few
  /// as they compute a row alone), and dense_head_ms is 0. For tests that need the agreement only.
  bool time_dense_head = true;
  /// The FlashHead evaluated; null: the engine's. Another one must be of the engine's image and
  /// head (a variant of its settings: head::FlashHead::set_proof, set_bound_terms).
  const head::FlashHead* flashhead = nullptr;
};

struct ProbeResult {
  size_t probes = 0;
  double candidates = 0;       // mean tokens scored in stage 2
  double same_top1_pct = 0;    // FlashHead's greedy token == the dense head's
  double recall_pct = 0;       // the dense argmax is among the candidates
  double head_ms = 0;          // median FlashHead time per position (stage 1 + 2)
  double mean_tv = 0;          // mean total-variation distance of the sampling distributions
  double max_tv = 0;
  // Sampling coverage (FlashHeadEvalOptions::top_p_cover; all 0 when it is 0): the dense
  // distribution is softmax of the dense logits at temperature 1 over the whole vocabulary.
  double top_p_cover_pct = 0;  // positions whose candidates hold every token of the dense top-p nucleus
  double missed_mass = 0;      // mean dense probability outside the candidates (what a sampler loses)
  double max_missed_mass = 0;
  // Positions whose candidates hold every token the dense sampler (`sampler`) can draw (its
  // distribution's support after top-k, top-p and min-p); 0 without the TV comparison or the
  // coverage (top_p_cover 0).
  double sampler_cover_pct = 0;
  // FlashHead's greedy proof (head::Proof), over the positions; all 0 but unproven_pct without it.
  double mean_probes = 0;       // clusters scored per position: the probes plus the proof's
  double extra_probes_pct = 0;  // positions proven after probing more clusters
  double dense_pct = 0;         // positions that fell back to scoring every cluster
  double unproven_pct = 0;      // positions searched without the proof
};

struct FlashHeadEvalResult {
  size_t positions = 0;
  double dense_head_ms = 0;    // median dense head time per position (GEMV + soft-cap)
  double top_p = 0;            // FlashHeadEvalOptions::top_p_cover (0: coverage not measured)
  double mean_nucleus = 0;     // tokens in the dense top-p nucleus, mean over the positions
  size_t max_nucleus = 0;
  std::vector<ProbeResult> rows;
};

/// Runs `tokens` through the engine's model in chunks and, at every position, scores the next
/// token with the dense head and with FlashHead at each probe count. The engine must have
/// FlashHead (HeadMode::kAuto or kFlash on a --flashhead image); kestrel::Error otherwise, or
/// when there are fewer than 2 tokens. `progress(done, total)` after each chunk.
FlashHeadEvalResult evaluate_flashhead(Engine& engine, std::span<const TokenId> tokens,
                                       const FlashHeadEvalOptions& options,
                                       const std::function<void(size_t, size_t)>& progress = nullptr);

/// softmax(logits) at temperature 1, float64 [n] summing to 1 (exp of runtime::log_softmax, float64;
/// -inf logits get probability 0). logits float32 [n], n >= 1,
/// at least one finite.
std::vector<double> softmax(std::span<const float> logits);

/// The top-p nucleus of a distribution (probs [n], summing to 1): token ids by descending
/// probability, ties to the lower id, up to and including the first at which the cumulative
/// probability (summed in that order, float64) reaches p: the smallest such prefix, as llama.cpp's
/// and Hugging Face's top-p keep. p in (0, 1]; when the sum never reaches p (rounding, p = 1)
/// every token. kestrel::Error for p outside (0, 1] or empty probs.
std::vector<TokenId> top_p_nucleus(std::span<const double> probs, double p);

/// How a candidate set covers a distribution (nucleus_cover).
struct NucleusCover {
  bool covered = false;     // every token of the nucleus is a candidate
  double missed_mass = 0;   // probability of the tokens that are not candidates, in [0, 1]
};

/// Whether `candidates` (token ids < probs.size(), duplicates allowed) hold every token of
/// `nucleus` (top_p_nucleus of probs), and the mass of probs outside the candidates (summed over
/// the non-candidates, so exactly 0 when every token is one). O(probs.size()).
NucleusCover nucleus_cover(std::span<const double> probs, std::span<const TokenId> nucleus,
                           std::span<const TokenId> candidates);

/// Total-variation distance 1/2 sum_t |p_t - q_t| of two sparse distributions given as
/// (token, probability) pairs (tokens absent from one side have probability 0 there).
double total_variation(const std::vector<std::pair<TokenId, double>>& p,
                       const std::vector<std::pair<TokenId, double>>& q);

}  // namespace kestrel::runtime
