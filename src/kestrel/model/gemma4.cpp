#include "kestrel/model/gemma4.h"

#include <algorithm>
#include <cmath>

#include "kestrel/base/error.h"
#include "kestrel/head/flashhead_format.h"
#include "kestrel/image/image.h"
#include "kestrel/kernels/ops.h"
#include "kestrel/model/attention.h"
#include "kestrel/model/gemma_common.h"

namespace kestrel::model {
namespace {

constexpr const char* kArch = "gemma4";

std::string key(const char* suffix) { return std::string(kArch) + "." + suffix; }

using gemma::blk;
using gemma::kMaxDim;
using gemma::positive;

/// A hyperparameter written either as one number or as one number per layer.
std::vector<size_t> per_layer(const gguf::File& file, const std::string& name, size_t n_layers) {
  const gguf::Value* v = file.find(name);
  if (v == nullptr) throw Error("model file has no metadata " + name);
  if (v->type != gguf::ValueType::kArray) return std::vector<size_t>(n_layers, positive(file, name));
  const std::vector<int64_t> raw = file.get_int_array(name);
  if (raw.size() != n_layers) {
    throw Error("metadata " + name + " has " + std::to_string(raw.size()) + " entries for " +
                std::to_string(n_layers) + " layers");
  }
  std::vector<size_t> out;
  for (const int64_t x : raw) {
    if (x <= 0 || static_cast<uint64_t>(x) > kMaxDim) throw Error("metadata " + name + " has an entry out of range");
    out.push_back(static_cast<size_t>(x));
  }
  return out;
}

}  // namespace

size_t Gemma4Config::kv_source(size_t layer) const {
  if (layer < first_shared()) return layer;
  for (size_t j = first_shared(); j-- > 0;) {
    if (sliding[j] == sliding[layer]) return j;
  }
  throw Error("gemma4: KV-shared layer " + std::to_string(layer) + " has no earlier layer of its type");
}

Gemma4Config Gemma4Config::from_gguf(const gguf::File& file) {
  Gemma4Config c;
  c.n_layers = positive(file, key("block_count"));
  c.d_model = positive(file, key("embedding_length"));
  c.n_heads = positive(file, key("attention.head_count"));
  c.d_ff = per_layer(file, key("feed_forward_length"), c.n_layers);
  c.n_kv_heads = per_layer(file, key("attention.head_count_kv"), c.n_layers);
  c.head_dim_full = positive(file, key("attention.key_length"));
  c.head_dim_sliding = positive(file, key("attention.key_length_swa"));
  if (positive(file, key("attention.value_length")) != c.head_dim_full ||
      positive(file, key("attention.value_length_swa")) != c.head_dim_sliding) {
    throw Error("gemma4: key and value lengths differ, which Gemma 4 never does");
  }
  c.n_rot_full = file.find_uint(key("rope.dimension_count")).value_or(c.head_dim_full);
  c.n_rot_sliding = file.find_uint(key("rope.dimension_count_swa")).value_or(c.head_dim_sliding);
  if (c.n_rot_full > c.head_dim_full || c.n_rot_sliding > c.head_dim_sliding ||
      c.n_rot_full % 2 != 0 || c.n_rot_sliding % 2 != 0 || c.n_rot_full == 0 || c.n_rot_sliding == 0) {
    throw Error("gemma4: rope.dimension_count must be even, positive and at most the head size");
  }
  for (size_t il = 0; il < c.n_layers; ++il) {
    if (c.n_heads % c.n_kv_heads[il] != 0) {
      throw Error("gemma4: head_count is not a multiple of head_count_kv at layer " + std::to_string(il));
    }
  }
  c.context_length = positive(file, key("context_length"));
  c.sliding_window = positive(file, key("attention.sliding_window"));
  {
    const gguf::Array& pattern = file.get_array(key("attention.sliding_window_pattern"));
    const auto* flags = std::get_if<std::vector<uint8_t>>(&pattern.items);
    if (flags == nullptr || flags->size() != c.n_layers) {
      throw Error("gemma4: attention.sliding_window_pattern must be one bool per layer");
    }
    for (const uint8_t f : *flags) c.sliding.push_back(f != 0);
  }
  const uint64_t shared = file.find_uint(key("attention.shared_kv_layers")).value_or(0);
  if (shared >= c.n_layers) throw Error("gemma4: attention.shared_kv_layers must be below block_count");
  c.n_kv_shared = static_cast<size_t>(shared);
  for (size_t il = c.first_shared(); il < c.n_layers; ++il) c.kv_source(il);  // throws if none
  const uint64_t ple = file.find_uint(key("embedding_length_per_layer_input")).value_or(0);
  if (ple > kMaxDim) throw Error("gemma4: embedding_length_per_layer_input is out of range");
  c.ple_dim = static_cast<size_t>(ple);
  c.rms_eps = static_cast<float>(file.get_float(key("attention.layer_norm_rms_epsilon")));
  if (!(c.rms_eps > 0.0f && c.rms_eps < 1.0f)) {
    throw Error("gemma4: attention.layer_norm_rms_epsilon must be in (0, 1), got " + std::to_string(c.rms_eps));
  }
  c.rope_base_full = static_cast<float>(file.get_float(key("rope.freq_base")));
  c.rope_base_sliding = static_cast<float>(file.find_float(key("rope.freq_base_swa")).value_or(1e4));
  if (!(c.rope_base_full > 1.0f) || !(c.rope_base_sliding > 1.0f)) throw Error("gemma4: RoPE bases must exceed 1");
  c.final_softcap = static_cast<float>(file.find_float(key("final_logit_softcapping")).value_or(0.0));
  if (c.final_softcap < 0.0f) throw Error("gemma4: final_logit_softcapping must not be negative");
  c.embed_scale = std::sqrt(static_cast<float>(c.d_model));
  return c;
}

Gemma4Model::Gemma4Model(const gguf::File& file, const LoadOptions& options, ThreadPool& pool)
    : config_(Gemma4Config::from_gguf(file)), store_(file, options, pool) {
  const auto& c = config_;
  const auto* embd = file.find_tensor("token_embd.weight");
  if (embd == nullptr) embd = file.find_tensor(std::string("token_embd.weight") + image::kQ4Suffix);
  if (embd == nullptr || embd->shape.size() != 2) throw Error("model file has no 2-D token_embd.weight");
  config_.n_vocab = static_cast<size_t>(embd->shape[1]);
  embedding_ = store_.source_matrix("token_embd.weight", config_.n_vocab, c.d_model);
  tied_ = !store_.has("output.weight");
  head_.weight = tied_ ? embedding_ : store_.source_matrix("output.weight", config_.n_vocab, c.d_model);
  head_.final_softcap = c.final_softcap;
  if (const auto order = head::find_row_order(file)) head_.set_row_order(*order);
  output_norm_ = store_.vector("output_norm.weight", c.d_model);

  if (c.ple_dim > 0) {
    const size_t width = c.n_layers * c.ple_dim;
    ple_.table = PerLayerTable(file, store_, config_.n_vocab, width);
    ple_.model_proj = store_.source_matrix("per_layer_model_proj.weight", width, c.d_model);
    ple_.proj_norm = store_.vector("per_layer_proj_norm.weight", c.ple_dim);
    ple_.n_layers = c.n_layers;
    ple_.dim = c.ple_dim;
    ple_.d_model = c.d_model;
    ple_.eps = c.rms_eps;
  }

  const float* rope_factors = nullptr;
  if (store_.has("rope_freqs.weight")) rope_factors = store_.vector("rope_freqs.weight", c.n_rot_full / 2);
  for (size_t il = 0; il < c.n_layers; ++il) {
    const size_t hd = c.head_dim(il);
    const size_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads[il] * hd;
    const bool owns_kv = il < c.first_shared();
    Layer l{};
    l.attn_norm = store_.vector(blk(il, "attn_norm"), c.d_model);
    l.wq = store_.matrix(blk(il, "attn_q"), q_dim, c.d_model);
    l.q_norm = store_.vector(blk(il, "attn_q_norm"), hd);
    if (owns_kv) {
      l.wk = store_.matrix(blk(il, "attn_k"), kv_dim, c.d_model);
      // A layer without attn_v uses K as V (HF attention_k_eq_v).
      if (store_.has(blk(il, "attn_v")) || store_.has(blk(il, "attn_v") + image::kQ4Suffix)) {
        l.wv = store_.matrix(blk(il, "attn_v"), kv_dim, c.d_model);
      }
      l.k_norm = store_.vector(blk(il, "attn_k_norm"), hd);
    }
    l.wo = store_.matrix(blk(il, "attn_output"), c.d_model, q_dim);
    l.post_attn_norm = store_.vector(blk(il, "post_attention_norm"), c.d_model);
    l.mlp = gemma::load_geglu_mlp(store_, il, c.d_model, c.d_ff[il]);
    if (c.ple_dim > 0) {
      l.ple_gate = store_.matrix(blk(il, "inp_gate"), c.ple_dim, c.d_model);
      l.ple_proj = store_.matrix(blk(il, "proj"), c.d_model, c.ple_dim);
      l.ple_post_norm = store_.vector(blk(il, "post_norm"), c.d_model);
    }
    l.out_scale = store_.has(blk(il, "layer_output_scale")) ? *store_.vector(blk(il, "layer_output_scale"), 1) : 1.0f;
    if (!std::isfinite(l.out_scale)) throw Error("gemma4: layer_output_scale of layer " + std::to_string(il) + " is not finite");
    layers_.push_back(l);
  }
  inv_freq_full_ = gemma::rope_inverse_frequencies(c.rope_base_full, c.n_rot_full, rope_factors);
  inv_freq_sliding_ = gemma::rope_inverse_frequencies(c.rope_base_sliding, c.n_rot_sliding);
  info_.architecture = kArch;
  info_.name = file.find_string("general.name").value_or("");
  info_.n_vocab = config_.n_vocab;
  info_.d_model = c.d_model;
  info_.n_layers = c.n_layers;
  info_.context_length = c.context_length;
  info_.n_params = store_.n_params();
}

KvCache Gemma4Model::new_cache(size_t n_ctx) const {
  const auto& c = config_;
  if (n_ctx == 0 || n_ctx > c.context_length) {
    throw Error("context size " + std::to_string(n_ctx) + " is outside 1.." +
                std::to_string(c.context_length) + " for this model");
  }
  std::vector<LayerCacheSpec> specs;
  for (size_t il = 0; il < c.n_layers; ++il) {
    const bool sliding = c.is_sliding(il);
    const size_t capacity = il >= c.first_shared() ? 0
                            : sliding              ? std::min(n_ctx, c.sliding_window + kMaxUbatch - 1)
                                                   : n_ctx;
    specs.push_back({capacity, c.n_kv_heads[il] * c.head_dim(il), sliding ? c.sliding_window : 0});
  }
  return KvCache::allocate(n_ctx, specs);
}

void Gemma4Model::check(std::span<const TokenId> tokens, const KvCache& cache) const {
  const auto& c = config_;
  gemma::check_forward(tokens, cache, c.n_layers, c.n_vocab);
  for (size_t il = 0; il < c.n_layers; ++il) {
    if (cache.layers[il].stride != c.n_kv_heads[il] * c.head_dim(il)) throw Error("forward: cache of another model");
  }
}

void Gemma4Model::forward_hidden(std::span<const TokenId> tokens, KvCache& cache, Logits which,
                                 float* hidden, ThreadPool& pool,
                                 ActivationObserver* observer) const {
  check(tokens, cache);
  gemma::for_each_ubatch(tokens, which, hidden, config_.d_model, kMaxUbatch,
                         [&](std::span<const TokenId> chunk, float* out) {
                           const gemma::Segment seg{0, chunk.size(), cache.n_past, &cache, out};
                           forward_chunk(chunk, {&seg, 1}, which, pool, observer);
                         });
}

void Gemma4Model::forward_batch(std::span<const BatchSequence> seqs, ThreadPool& pool) const {
  gemma::check_batch(seqs, kMaxUbatch, [&](std::span<const TokenId> tokens, const KvCache& cache) {
    check(tokens, cache);
  });
  std::vector<TokenId> tokens;
  std::vector<gemma::Segment> segs;
  gemma::gather_batch(seqs, tokens, segs);
  forward_chunk(tokens, segs, Logits::kLast, pool, nullptr);
}

void Gemma4Model::attention_block(const Layer& l, size_t il, size_t n,
                                  std::span<const gemma::Segment> segs, std::vector<float>& x,
                                  ThreadPool& pool, ActivationObserver* observer) const {
  const auto& c = config_;
  const size_t d = c.d_model, hd = c.head_dim(il);
  const size_t n_kv = c.n_kv_heads[il];
  const size_t q_dim = c.n_heads * hd, kv_dim = n_kv * hd;
  const bool sliding = c.is_sliding(il);
  const bool owns_kv = il < c.first_shared();
  const size_t n_rot = sliding ? c.n_rot_sliding : c.n_rot_full;
  const auto& inv_freq = sliding ? inv_freq_sliding_ : inv_freq_full_;
  std::vector<float> xn(n * d), q(n * q_dim), attn(n * q_dim), k, v;
  pool.parallel_for(n, 1, [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) kernels::rms_norm(&x[t * d], l.attn_norm, &xn[t * d], d, c.rms_eps);
  });
  if (observer) {
    observer->observe(blk(il, "attn_q"), xn.data(), n, d);
    if (owns_kv) observer->observe(blk(il, "attn_k"), xn.data(), n, d);
    if (owns_kv && l.wv.data != nullptr) observer->observe(blk(il, "attn_v"), xn.data(), n, d);
  }
  std::vector<kernels::MatmulOutput> qkv{{&l.wq, q.data(), q_dim}};
  if (owns_kv) {
    k.resize(n * kv_dim);
    v.resize(n * kv_dim);
    qkv.push_back({&l.wk, k.data(), kv_dim});
    if (l.wv.data != nullptr) qkv.push_back({&l.wv, v.data(), kv_dim});
  }
  kernels::matmul_same_input(qkv, xn.data(), n, d, pool);
  if (owns_kv && l.wv.data == nullptr) v = k;
  const size_t kv_layer = owns_kv ? il : c.kv_source(il);
  pool.parallel_for(n, 1, [&](size_t b, size_t e) {
    std::vector<float> cos_sin(n_rot);
    for (size_t t = b; t < e; ++t) {
      float* qt = &q[t * q_dim];
      const gemma::Segment& seg = gemma::segment_of(segs, t);
      const size_t pos = seg.pos0 + (t - seg.first);
      gemma::rope_cos_sin(inv_freq, static_cast<double>(pos), cos_sin.data());
      for (size_t h = 0; h < c.n_heads; ++h) kernels::rms_norm(qt + h * hd, l.q_norm, qt + h * hd, hd, c.rms_eps);
      kernels::rope_neox(qt, c.n_heads, hd, n_rot, cos_sin.data());
      if (!owns_kv) continue;
      float* kt = &k[t * kv_dim];
      float* vt = &v[t * kv_dim];
      for (size_t h = 0; h < n_kv; ++h) {
        kernels::rms_norm(kt + h * hd, l.k_norm, kt + h * hd, hd, c.rms_eps);
        kernels::rms_norm_unweighted(vt + h * hd, vt + h * hd, hd, c.rms_eps);
      }
      kernels::rope_neox(kt, n_kv, hd, n_rot, cos_sin.data());
      LayerCache& lc = seg.cache->layers[il];
      const size_t slot = pos % lc.capacity;
      kernels::to_fp16(kt, &lc.k[slot * lc.stride], kv_dim);
      kernels::to_fp16(vt, &lc.v[slot * lc.stride], kv_dim);
    }
  });
  // Attention scale 1: the q/k norms take the place of 1/sqrt(head_dim) (HF self.scaling = 1.0).
  const AttentionShape shape{c.n_heads, n_kv, hd, sliding ? c.sliding_window : 0};
  for (const gemma::Segment& seg : segs) {
    cached_attention(shape, &q[seg.first * q_dim], seg.n, seg.pos0, seg.cache->layers[kv_layer],
                     &attn[seg.first * q_dim], pool);
  }

  std::vector<float>& o = xn;  // reuse: [n, d]
  if (observer) observer->observe(blk(il, "attn_output"), attn.data(), n, q_dim);
  kernels::matmul(l.wo, attn.data(), n, q_dim, o.data(), d, pool);
  gemma::add_post_normed(x.data(), o.data(), l.post_attn_norm, n, d, c.rms_eps, pool);
}

// x += rms(W_proj (gelu(W_gate x) * pl_i)) * w_post_norm, pl_i this layer's per-layer input.
void Gemma4Model::ple_block(const Layer& l, size_t il, size_t n, const float* pl,
                            std::vector<float>& x, ThreadPool& pool,
                            ActivationObserver* observer) const {
  const auto& c = config_;
  const size_t d = c.d_model, p = c.ple_dim, width = c.n_layers * p;
  std::vector<float> g(n * p), u(n * d);
  if (observer) observer->observe(blk(il, "inp_gate"), x.data(), n, d);
  kernels::matmul(l.ple_gate, x.data(), n, d, g.data(), p, pool);
  for (size_t t = 0; t < n; ++t) kernels::gelu_tanh_mul(&g[t * p], pl + t * width + il * p, &g[t * p], p);
  if (observer) observer->observe(blk(il, "proj"), g.data(), n, p);
  kernels::matmul(l.ple_proj, g.data(), n, p, u.data(), d, pool);
  gemma::add_post_normed(x.data(), u.data(), l.ple_post_norm, n, d, c.rms_eps, pool);
}

void Gemma4Model::forward_chunk(std::span<const TokenId> tokens, std::span<const gemma::Segment> segs,
                                Logits which, ThreadPool& pool, ActivationObserver* observer) const {
  const auto& c = config_;
  const size_t n = tokens.size(), d = c.d_model;
  std::vector<float> x(n * d);
  gemma::embed(embedding_, head_, tied_, tokens, c.embed_scale, d, x.data(), pool);
  std::vector<float> pl;
  if (c.ple_dim > 0) {
    pl.resize(n * c.n_layers * c.ple_dim);
    ple_.compute(tokens, x.data(), pl.data(), pool, observer);
  }
  for (size_t il = 0; il < c.n_layers; ++il) {
    const Layer& l = layers_[il];
    attention_block(l, il, n, segs, x, pool, observer);
    gemma::geglu_mlp(l.mlp, il, n, d, c.d_ff[il], c.rms_eps, x, pool, observer);
    if (c.ple_dim > 0) ple_block(l, il, n, pl.data(), x, pool, observer);
    if (l.out_scale != 1.0f) kernels::scale_inplace(x.data(), l.out_scale, n * d);
  }
  gemma::finish_segments(tokens, segs, x.data(), output_norm_, which, d, c.rms_eps);
}

}  // namespace kestrel::model
