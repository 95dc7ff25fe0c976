// The parts of a Gemma decoder that Gemma 3 and Gemma 4 share (HF transformers
// models/gemma3/modeling_gemma3.py and models/gemma4/modeling_gemma4.py; llama.cpp
// src/models/gemma3.cpp and gemma4.cpp): metadata checks, RoPE tables, input validation and
// ubatching, the scaled embedding lookup, the sandwich-normed GeGLU MLP and the final norm.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kestrel/base/thread_pool.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/head/output_head.h"
#include "kestrel/kernels/matmul.h"
#include "kestrel/model/model.h"

namespace kestrel::model::gemma {

/// Upper bound for any dimension read from metadata (16 Mi).
inline constexpr uint64_t kMaxDim = 1u << 24;

/// Metadata `name` as a dimension in 1..kMaxDim. Throws kestrel::Error when missing or out of range.
size_t positive(const gguf::File& file, const std::string& name);

/// "blk.<il>.<name>.weight", llama.cpp's tensor name for a layer weight.
std::string blk(size_t il, const char* name);

/// RoPE inverse frequencies inv_freq[i] = base^(-2i / n_rot) / factors[i], i < n_rot / 2
/// (RoFormer, Su et al. 2021, eq. 15; `factors` = llama.cpp's rope_freqs, null for none).
std::vector<float> rope_inverse_frequencies(double base, size_t n_rot, const float* factors = nullptr);

/// Interleaved (cos, sin) of position · inv_freq[i] into out[2i], out[2i + 1]; out has
/// 2 · inv_freq.size() floats.
void rope_cos_sin(const std::vector<float>& inv_freq, double position, float* out);

/// Throws kestrel::Error for an empty batch, a cache of another model (`n_layers`), a batch
/// that overflows the context or a token id outside 0..n_vocab-1.
void check_forward(std::span<const TokenId> tokens, const KvCache& cache, size_t n_layers, size_t n_vocab);

/// Rows [first, first + n) of a forward chunk: one sequence's tokens at positions pos0 .. pos0 +
/// n - 1 of `cache` (pos0 = cache->n_past when the chunk starts). A chunk's segments are
/// consecutive, each of its own cache; forward_hidden runs one, forward_batch one per sequence.
struct Segment {
  size_t first = 0;
  size_t n = 0;
  size_t pos0 = 0;
  KvCache* cache = nullptr;
  float* hidden = nullptr;  // the final hidden states per `which` (kAll: n rows, kLast: the last), or null
};

/// The segment that holds row t (segs consecutive and covering t).
const Segment& segment_of(std::span<const Segment> segs, size_t t);

/// Validates a forward_batch before anything runs: at least one sequence, each with a cache,
/// at most `max_tokens` tokens in all, no cache twice, and each sequence as `check(tokens,
/// cache)` validates it. Throws kestrel::Error.
void check_batch(std::span<const BatchSequence> seqs, size_t max_tokens,
                 const std::function<void(std::span<const TokenId>, const KvCache&)>& check);

/// The tokens of `seqs` one after another, and one segment per sequence (hidden: its last row).
void gather_batch(std::span<const BatchSequence> seqs, std::vector<TokenId>& tokens,
                  std::vector<Segment>& segs);

/// Calls chunk(tokens, hidden_out) for consecutive ubatches of at most `max_ubatch` tokens;
/// hidden_out points into `hidden` ([rows, d_model] float32) where that ubatch's rows go
/// (Logits::kAll: every row; kLast: the last row of the last ubatch), else null.
void for_each_ubatch(std::span<const TokenId> tokens, Logits which, float* hidden, size_t d_model,
                     size_t max_ubatch, const std::function<void(std::span<const TokenId>, float*)>& chunk);

/// x[t] = embedding row of tokens[t] · scale (Gemma multiplies by sqrt(d_model)); rows found
/// through the head's token → row map when the embedding is the tied head. x: [n, d_model].
void embed(const kernels::Matrix& embedding, const head::OutputHead& head, bool tied,
           std::span<const TokenId> tokens, float scale, size_t d_model, float* x, ThreadPool& pool);

/// x[t] += rms_norm(y[t]) · w for t < n (Gemma's post-norm before the residual add); y is
/// normalized in place. x, y: [n, d].
void add_post_normed(float* x, float* y, const float* w, size_t n, size_t d, float eps, ThreadPool& pool);

/// Weights of one GeGLU MLP with Gemma's sandwich norms.
struct GegluMlp {
  const float* norm = nullptr;       // [d_model], before the MLP (ffn_norm)
  kernels::Matrix gate, up, down;    // [d_ff, d_model], [d_ff, d_model], [d_model, d_ff]
  const float* post_norm = nullptr;  // [d_model], after it (post_ffw_norm)
};

/// Loads blk.<il>.{ffn_norm, ffn_gate, ffn_up, ffn_down, post_ffw_norm} for width d_ff.
template <class Store>
GegluMlp load_geglu_mlp(Store& store, size_t il, size_t d_model, size_t d_ff) {
  GegluMlp m;
  m.norm = store.vector(blk(il, "ffn_norm"), d_model);
  m.gate = store.matrix(blk(il, "ffn_gate"), d_ff, d_model);
  m.up = store.matrix(blk(il, "ffn_up"), d_ff, d_model);
  m.down = store.matrix(blk(il, "ffn_down"), d_model, d_ff);
  m.post_norm = store.vector(blk(il, "post_ffw_norm"), d_model);
  return m;
}

/// x += post_norm(down(gelu_tanh(gate(norm(x))) · up(norm(x)))) for the n rows of x
/// ([n, d_model] float32); reports the inputs of ffn_gate/ffn_up/ffn_down of layer il to
/// `observer` when given.
void geglu_mlp(const GegluMlp& w, size_t il, size_t n, size_t d_model, size_t d_ff, float eps,
               std::vector<float>& x, ThreadPool& pool, ActivationObserver* observer);

/// hidden[t - first] = rms_norm(x[t]) · w for the rows that `which` asks for (kAll: every row,
/// kLast: the last); x: [n, d].
void final_norm(const float* x, const float* w, Logits which, size_t n, size_t d, float eps, float* hidden);

/// For each segment: records its tokens in its cache (KvCache::append) and writes its hidden
/// states by final_norm over its rows of x ([rows, d]).
void finish_segments(std::span<const TokenId> tokens, std::span<const Segment> segs, const float* x,
                     const float* w, Logits which, size_t d, float eps);

}  // namespace kestrel::model::gemma
