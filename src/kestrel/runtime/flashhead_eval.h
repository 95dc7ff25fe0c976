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
  // FlashHead's greedy proof (head::Proof), over the positions; all 0 but unproven_pct without it.
  double mean_probes = 0;       // clusters scored per position: the probes plus the proof's
  double extra_probes_pct = 0;  // positions proven after probing more clusters
  double dense_pct = 0;         // positions that fell back to scoring every cluster
  double unproven_pct = 0;      // positions searched without the proof
};

struct FlashHeadEvalResult {
  size_t positions = 0;
  double dense_head_ms = 0;    // median dense head time per position (GEMV + soft-cap)
  std::vector<ProbeResult> rows;
};

/// Runs `tokens` through the engine's model in chunks and, at every position, scores the next
/// token with the dense head and with FlashHead at each probe count. The engine must have
/// FlashHead (HeadMode::kAuto or kFlash on a --flashhead image); kestrel::Error otherwise, or
/// when there are fewer than 2 tokens. `progress(done, total)` after each chunk.
FlashHeadEvalResult evaluate_flashhead(Engine& engine, std::span<const TokenId> tokens,
                                       const FlashHeadEvalOptions& options,
                                       const std::function<void(size_t, size_t)>& progress = nullptr);

/// Total-variation distance 1/2 sum_t |p_t - q_t| of two sparse distributions given as
/// (token, probability) pairs (tokens absent from one side have probability 0 there).
double total_variation(const std::vector<std::pair<TokenId, double>>& p,
                       const std::vector<std::pair<TokenId, double>>& q);

}  // namespace kestrel::runtime
