#include "kestrel/model/gemma3.h"

#include <algorithm>
#include <cmath>

#include "kestrel/base/error.h"
#include "kestrel/head/flashhead_format.h"
#include "kestrel/model/attention.h"
#include "kestrel/model/gemma_common.h"
#include "kestrel/kernels/ops.h"

namespace kestrel::model {
namespace {

using gemma::blk;
using gemma::positive;

constexpr const char* kArch = "gemma3";

std::string key(const char* suffix) { return std::string(kArch) + "." + suffix; }

}  // namespace

Gemma3Config Gemma3Config::from_gguf(const gguf::File& file) {
  Gemma3Config c;
  c.n_layers = positive(file, key("block_count"));
  c.d_model = positive(file, key("embedding_length"));
  c.d_ff = positive(file, key("feed_forward_length"));
  c.n_heads = positive(file, key("attention.head_count"));
  c.n_kv_heads = positive(file, key("attention.head_count_kv"));
  c.head_dim = positive(file, key("attention.key_length"));
  if (positive(file, key("attention.value_length")) != c.head_dim) {
    throw Error("gemma3: key_length and value_length differ, which Gemma 3 never does");
  }
  if (c.n_heads % c.n_kv_heads != 0) throw Error("gemma3: head_count is not a multiple of head_count_kv");
  if (c.head_dim % 2 != 0) throw Error("gemma3: key_length must be even for RoPE");
  c.context_length = positive(file, key("context_length"));
  c.sliding_window = positive(file, key("attention.sliding_window"));
  c.sliding_window_pattern = file.find_uint(key("attention.sliding_window_pattern")).value_or(6);
  if (c.sliding_window_pattern == 0) throw Error("gemma3: sliding_window_pattern must be > 0");
  c.rms_eps = static_cast<float>(file.get_float(key("attention.layer_norm_rms_epsilon")));
  if (!(c.rms_eps > 0.0f && c.rms_eps < 1.0f)) {
    throw Error("gemma3: attention.layer_norm_rms_epsilon must be in (0, 1), got " + std::to_string(c.rms_eps));
  }
  c.rope_base_global = static_cast<float>(file.get_float(key("rope.freq_base")));
  c.rope_base_sliding = static_cast<float>(file.find_float(key("rope.freq_base_swa")).value_or(1e4));
  if (const auto type = file.find_string(key("rope.scaling.type")); type && *type == "linear") {
    const double factor = file.get_float(key("rope.scaling.factor"));
    if (!(factor > 0.0)) throw Error("gemma3: rope.scaling.factor must be positive");
    c.rope_scale_global = static_cast<float>(1.0 / factor);
  }
  c.final_softcap = static_cast<float>(file.find_float(key("final_logit_softcapping")).value_or(0.0));
  // llama.cpp (hparams.f_attention_scale for gemma3) and HF (query_pre_attn_scalar = head_dim
  // for every Gemma 3 size but 27B) agree on 1/sqrt(head_dim).
  c.attention_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  c.embed_scale = std::sqrt(static_cast<float>(c.d_model));
  const auto& tokens = file.get_array("tokenizer.ggml.tokens");
  c.n_vocab = tokens.size();
  return c;
}

Gemma3Model::Gemma3Model(const gguf::File& file, const LoadOptions& options, ThreadPool& pool)
    : config_(Gemma3Config::from_gguf(file)), store_(file, options, pool) {
  const auto& c = config_;
  // The vocabulary is the embedding's rows (llama.cpp's converter trims the table to the
  // tokenizer; they are equal for every Gemma 3 file).
  const auto* embd = file.find_tensor("token_embd.weight");
  if (embd == nullptr) embd = file.find_tensor(std::string("token_embd.weight") + image::kQ4Suffix);
  if (embd == nullptr || embd->shape.size() != 2) throw Error("model file has no 2-D token_embd.weight");
  config_.n_vocab = static_cast<size_t>(embd->shape[1]);
  // The embedding (and the tied output head) keeps the source's form in every precision:
  // Q8_0 in the default model. docs/quantization.md has the measurement behind this.
  embedding_ = store_.source_matrix("token_embd.weight", config_.n_vocab, c.d_model);
  tied_ = !store_.has("output.weight");
  head_.weight = tied_ ? embedding_ : store_.source_matrix("output.weight", config_.n_vocab, c.d_model);
  head_.final_softcap = c.final_softcap;
  if (const auto order = head::find_row_order(file)) head_.set_row_order(*order);
  output_norm_ = store_.vector("output_norm.weight", c.d_model);
  const size_t q_dim = c.n_heads * c.head_dim;
  const size_t kv_dim = c.n_kv_heads * c.head_dim;
  for (size_t il = 0; il < c.n_layers; ++il) {
    Layer l;
    l.attn_norm = store_.vector(blk(il, "attn_norm"), c.d_model);
    l.wq = store_.matrix(blk(il, "attn_q"), q_dim, c.d_model);
    l.wk = store_.matrix(blk(il, "attn_k"), kv_dim, c.d_model);
    l.wv = store_.matrix(blk(il, "attn_v"), kv_dim, c.d_model);
    l.q_norm = store_.vector(blk(il, "attn_q_norm"), c.head_dim);
    l.k_norm = store_.vector(blk(il, "attn_k_norm"), c.head_dim);
    l.wo = store_.matrix(blk(il, "attn_output"), c.d_model, q_dim);
    l.post_attn_norm = store_.vector(blk(il, "post_attention_norm"), c.d_model);
    l.mlp = gemma::load_geglu_mlp(store_, il, c.d_model, c.d_ff);
    layers_.push_back(l);
  }
  inv_freq_global_ = gemma::rope_inverse_frequencies(c.rope_base_global, c.head_dim);
  inv_freq_sliding_ = gemma::rope_inverse_frequencies(c.rope_base_sliding, c.head_dim);
  info_.architecture = kArch;
  info_.name = file.find_string("general.name").value_or("");
  info_.n_vocab = config_.n_vocab;
  info_.d_model = c.d_model;
  info_.n_layers = c.n_layers;
  info_.context_length = c.context_length;
  info_.n_params = store_.n_params();
}

KvCache Gemma3Model::new_cache(size_t n_ctx) const {
  if (n_ctx == 0 || n_ctx > config_.context_length) {
    throw Error("context size " + std::to_string(n_ctx) + " is outside 1.." +
                std::to_string(config_.context_length) + " for this model");
  }
  std::vector<LayerCacheSpec> specs;
  for (size_t il = 0; il < config_.n_layers; ++il) {
    const bool sliding = config_.is_sliding(il);
    specs.push_back({sliding ? std::min(n_ctx, config_.sliding_window + kMaxUbatch - 1) : n_ctx,
                     config_.n_kv_heads * config_.head_dim, sliding ? config_.sliding_window : 0});
  }
  return KvCache::allocate(n_ctx, specs);
}

void Gemma3Model::forward_hidden(std::span<const TokenId> tokens, KvCache& cache, Logits which,
                                 float* hidden, ThreadPool& pool,
                                 ActivationObserver* observer) const {
  gemma::check_forward(tokens, cache, config_.n_layers, config_.n_vocab);
  gemma::for_each_ubatch(tokens, which, hidden, config_.d_model, kMaxUbatch,
                         [&](std::span<const TokenId> chunk, float* out) {
                           const gemma::Segment seg{0, chunk.size(), cache.n_past, &cache, out};
                           forward_chunk(chunk, {&seg, 1}, which, pool, observer);
                         });
}

void Gemma3Model::forward_batch(std::span<const BatchSequence> seqs, ThreadPool& pool) const {
  gemma::check_batch(seqs, kMaxUbatch, [&](std::span<const TokenId> tokens, const KvCache& cache) {
    gemma::check_forward(tokens, cache, config_.n_layers, config_.n_vocab);
  });
  std::vector<TokenId> tokens;
  std::vector<gemma::Segment> segs;
  gemma::gather_batch(seqs, tokens, segs);
  forward_chunk(tokens, segs, Logits::kLast, pool, nullptr);
}

void Gemma3Model::attention_block(const Layer& l, size_t il, size_t n,
                                  std::span<const gemma::Segment> segs, std::vector<float>& x,
                                  ThreadPool& pool, ActivationObserver* observer) const {
  const auto& c = config_;
  const size_t d = c.d_model, hd = c.head_dim;
  const size_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  const bool sliding = c.is_sliding(il);
  std::vector<float> xn(n * d), q(n * q_dim), k(n * kv_dim), v(n * kv_dim), attn(n * q_dim);
  pool.parallel_for(n, 1, [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) kernels::rms_norm(&x[t * d], l.attn_norm, &xn[t * d], d, c.rms_eps);
  });
  if (observer) {
    for (const char* m : {"attn_q", "attn_k", "attn_v"}) observer->observe(blk(il, m), xn.data(), n, d);
  }
  const kernels::MatmulOutput qkv[] = {
      {&l.wq, q.data(), q_dim}, {&l.wk, k.data(), kv_dim}, {&l.wv, v.data(), kv_dim}};
  kernels::matmul_same_input(qkv, xn.data(), n, d, pool);

  const auto& inv_freq = sliding ? inv_freq_sliding_ : inv_freq_global_;
  const double pos_scale = sliding ? 1.0 : static_cast<double>(c.rope_scale_global);
  pool.parallel_for(n, 1, [&](size_t b, size_t e) {
    std::vector<float> cos_sin(hd);
    for (size_t t = b; t < e; ++t) {
      float* qt = &q[t * q_dim];
      float* kt = &k[t * kv_dim];
      for (size_t h = 0; h < c.n_heads; ++h) kernels::rms_norm(qt + h * hd, l.q_norm, qt + h * hd, hd, c.rms_eps);
      for (size_t h = 0; h < c.n_kv_heads; ++h) kernels::rms_norm(kt + h * hd, l.k_norm, kt + h * hd, hd, c.rms_eps);
      const gemma::Segment& seg = gemma::segment_of(segs, t);
      const size_t pos = seg.pos0 + (t - seg.first);
      LayerCache& lc = seg.cache->layers[il];
      gemma::rope_cos_sin(inv_freq, static_cast<double>(pos) * pos_scale, cos_sin.data());
      kernels::rope_neox(qt, c.n_heads, hd, hd, cos_sin.data());
      kernels::rope_neox(kt, c.n_kv_heads, hd, hd, cos_sin.data());
      kernels::scale_inplace(qt, c.attention_scale, q_dim);
      const size_t slot = pos % lc.capacity;
      kernels::to_fp16(kt, &lc.k[slot * lc.stride], kv_dim);
      kernels::to_fp16(&v[t * kv_dim], &lc.v[slot * lc.stride], kv_dim);
    }
  });

  AttentionShape shape;
  shape.n_heads = c.n_heads;
  shape.n_kv_heads = c.n_kv_heads;
  shape.head_dim = hd;
  shape.window = sliding ? c.sliding_window : 0;
  for (const gemma::Segment& seg : segs) {
    cached_attention(shape, &q[seg.first * q_dim], seg.n, seg.pos0, seg.cache->layers[il],
                     &attn[seg.first * q_dim], pool);
  }

  std::vector<float>& o = xn;  // reuse: [n, d]
  if (observer) observer->observe(blk(il, "attn_output"), attn.data(), n, q_dim);
  kernels::matmul(l.wo, attn.data(), n, q_dim, o.data(), d, pool);
  gemma::add_post_normed(x.data(), o.data(), l.post_attn_norm, n, d, c.rms_eps, pool);
}

void Gemma3Model::forward_chunk(std::span<const TokenId> tokens, std::span<const gemma::Segment> segs,
                                Logits which, ThreadPool& pool, ActivationObserver* observer) const {
  const auto& c = config_;
  const size_t n = tokens.size(), d = c.d_model;
  std::vector<float> x(n * d);
  gemma::embed(embedding_, head_, tied_, tokens, c.embed_scale, d, x.data(), pool);
  for (size_t il = 0; il < c.n_layers; ++il) {
    attention_block(layers_[il], il, n, segs, x, pool, observer);
    gemma::geglu_mlp(layers_[il].mlp, il, n, d, c.d_ff, c.rms_eps, x, pool, observer);
  }
  gemma::finish_segments(tokens, segs, x.data(), output_norm_, which, d, c.rms_eps);
}

}  // namespace kestrel::model
