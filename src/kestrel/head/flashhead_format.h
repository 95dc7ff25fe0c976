// How FlashHead data sits in a Kestrel image (docs/flashhead.md, docs/image-format.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "kestrel/formats/gguf.h"
#include "kestrel/head/output_head.h"

namespace kestrel::head {

namespace keys {
/// Tokens per cluster (every cluster holds exactly this many).
inline constexpr const char* kClusterSize = "kestrel.flashhead.cluster_size";
/// Clusters K = n_vocab / cluster_size.
inline constexpr const char* kClusters = "kestrel.flashhead.n_clusters";
/// Probes used when the user does not choose.
inline constexpr const char* kProbes = "kestrel.flashhead.probes";
/// alpha of the stage-1 score c_k . h + alpha |h| radius_k (float32).
inline constexpr const char* kRadiusWeight = "kestrel.flashhead.radius_weight";
/// Seed of the clustering and its wall time (provenance).
inline constexpr const char* kSeed = "kestrel.flashhead.seed";
inline constexpr const char* kIterations = "kestrel.flashhead.iterations";
/// Version of the greedy proof's per-cluster data (flashhead.bound_radii / bound_norms); absent
/// in images built before it, which run without the proof (docs/flashhead.md).
inline constexpr const char* kBoundVersion = "kestrel.flashhead.bound_version";
inline constexpr uint32_t kCurrentBoundVersion = 1;
}  // namespace keys

/// I32 {n_vocab}: row r of the output head holds token row_tokens[r]; cluster k is rows
/// [k * cluster_size, (k + 1) * cluster_size). The head tensor itself is stored in this order.
inline constexpr const char* kRowTokensTensor = "flashhead.row_tokens";
/// Q8_0 {d_model, K}: the stage-1 centroids (int8 with an fp16 scale per 32 values).
inline constexpr const char* kCentroidsTensor = "flashhead.centroids";
/// F32 {K}: each cluster's radius, the largest distance of a member row from its centroid.
inline constexpr const char* kRadiiTensor = "flashhead.radii";
/// F32 {K}: the greedy proof's radius of each cluster, max |row - centroid|_2 over its rows, both
/// dequantized exactly (the Q8_0 centroid, not the float mean), rounded up (head/flashhead_bound.h).
inline constexpr const char* kBoundRadiiTensor = "flashhead.bound_radii";
/// F32 {K}: max |row|_2 over the cluster's rows plus |centroid|_2, rounded up: the rounding term.
inline constexpr const char* kBoundNormsTensor = "flashhead.bound_norms";
/// I32 {n}: tokens always scored in stage 2 (EOS, <end_of_turn>, other stop tokens).
inline constexpr const char* kSpecialTokensTensor = "flashhead.special_tokens";

/// The head's row order when `file` is an image built with FlashHead, else nullopt.
/// Throws kestrel::Error when the tensor exists with the wrong type or shape.
std::optional<std::span<const TokenId>> find_row_order(const gguf::File& file);

}  // namespace kestrel::head
