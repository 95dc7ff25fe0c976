#include "kestrel/model/gemma_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>

#include "kestrel/base/error.h"
#include "kestrel/head/flashhead_format.h"
#include "kestrel/image/image.h"
#include "kestrel/kernels/ops.h"
#include "kestrel/kernels/registry.h"
#include "kestrel/model/attention.h"

namespace kestrel::model {
namespace {

/// "blk.<il>.<name>.weight", llama.cpp's tensor name for a layer weight.
std::string blk(size_t il, const char* name) { return "blk." + std::to_string(il) + "." + name + ".weight"; }

/// RoPE inverse frequencies inv_freq[i] = base^(-2i / n_rot) / factors[i], i < n_rot / 2
/// (RoFormer, Su et al. 2021, eq. 15; `factors` = llama.cpp's rope_freqs, null for none).
std::vector<float> rope_inverse_frequencies(double base, size_t n_rot, const float* factors) {
  std::vector<float> f(n_rot / 2);
  for (size_t i = 0; i < f.size(); ++i) {
    double v = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
    if (factors != nullptr) v /= static_cast<double>(factors[i]);
    f[i] = static_cast<float>(v);
  }
  return f;
}

/// Interleaved (cos, sin) of position · inv_freq[i] into out[2i], out[2i + 1].
void rope_cos_sin(const std::vector<float>& inv_freq, double position, float* out) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double angle = position * static_cast<double>(inv_freq[i]);
    out[2 * i] = static_cast<float>(std::cos(angle));
    out[2 * i + 1] = static_cast<float>(std::sin(angle));
  }
}

/// Rows per task of an element-wise loop over rows of `width` floats: a task of at least
/// ~32k floats (tens of microseconds), so that the few rows of a decode step run on the calling
/// thread (a parallel loop's wake-up and wait cost more than a norm of 4 rows) while prefill
/// chunks still split over the threads.
size_t rows_grain(size_t width) { return std::max<size_t>(1, (size_t{1} << 15) / std::max<size_t>(width, 1)); }

/// x[t] += rms_norm(y[t]) · w for t < n (Gemma's post-norm before the residual add); y is
/// normalized in place. x, y: [n, d].
void add_post_normed(float* x, float* y, const float* w, size_t n, size_t d, float eps, ThreadPool& pool) {
  pool.parallel_for(n, rows_grain(d), [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      kernels::rms_norm(&y[t * d], w, &y[t * d], d, eps);
      kernels::add_inplace(&x[t * d], &y[t * d], d);
    }
  });
}

/// y[t] = rms_norm(x[t]) · w for t < n. x, y: [n, d].
void rms_norm_rows(const float* x, const float* w, float* y, size_t n, size_t d, float eps, ThreadPool& pool) {
  pool.parallel_for(n, rows_grain(d), [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) kernels::rms_norm(&x[t * d], w, &y[t * d], d, eps);
  });
}

}  // namespace

GemmaDecoder::Scratch::Scratch(const GemmaConfig& c, size_t n, size_t n_rope_tables) {
  size_t q_dim = 0, kv_dim = 0, n_rot = 0, d_ff = 0;
  for (const GemmaLayerConfig& l : c.layers) {
    q_dim = std::max(q_dim, c.n_heads * l.head_dim);
    kv_dim = std::max(kv_dim, l.n_kv_heads * l.head_dim);
    n_rot = std::max(n_rot, l.rope.n_rot);
    d_ff = std::max(d_ff, l.d_ff);
  }
  constexpr size_t kAlign = 64 / sizeof(float);
  const auto padded = [](size_t floats) { return (floats + kAlign - 1) / kAlign * kAlign; };
  float** const arrays[] = {&x, &xn, &q, &attn, &k, &v, &cos_sin, &gate, &up, &pl, &ple_gate};
  const size_t sizes[] = {n * c.d_model, n * c.d_model, n * q_dim, n * q_dim, n * kv_dim, n * kv_dim,
                          n_rope_tables * n * n_rot, n * d_ff, n * d_ff, n * c.n_layers() * c.ple_dim, n * c.ple_dim};
  size_t total = kAlign;
  for (const size_t floats : sizes) total += padded(floats);
  // The calling thread's arena, grown to the largest chunk seen and kept: a decode step
  // allocates nothing here once warm. Two Scratches of one thread never live at once
  // (forward_chunk does not nest).
  thread_local std::vector<float> arena;
  if (arena.size() < total) arena.resize(total);
  const auto base = reinterpret_cast<uintptr_t>(arena.data());
  size_t offset = ((base + 63) / 64 * 64 - base) / sizeof(float);  // to the first 64-byte boundary
  for (size_t i = 0; i < std::size(sizes); ++i) {
    *arrays[i] = arena.data() + offset;
    offset += padded(sizes[i]);
  }
}

GemmaDecoder::GemmaDecoder(const gguf::File& file, const LoadOptions& options, ThreadPool& pool)
    : config_(GemmaConfig::from_gguf(file)), store_(file, options, pool), kv_types_(options.kv_types) {
  GemmaConfig& c = config_;
  // The vocabulary is the embedding's rows (llama.cpp's converter trims the table to the
  // tokenizer; they are equal for every Gemma file).
  const auto* embd = file.find_tensor("token_embd.weight");
  if (embd == nullptr) embd = file.find_tensor(std::string("token_embd.weight") + image::kQ4Suffix);
  if (embd == nullptr || embd->shape.size() != 2) throw Error("model file has no 2-D token_embd.weight");
  c.n_vocab = static_cast<size_t>(embd->shape[1]);
  // The embedding (and the tied output head) keeps the source's form in every precision:
  // Q8_0 in the default model. docs/quantization.md has the measurement behind this.
  embedding_ = store_.source_matrix("token_embd.weight", c.n_vocab, c.d_model);
  tied_ = !store_.has("output.weight");
  head_.weight = tied_ ? embedding_ : store_.source_matrix("output.weight", c.n_vocab, c.d_model);
  // Without FlashHead the dense head computes every step's logits: its Q8_0 products take int8
  // activations where those are chosen, on an interleaved copy (~190 MB more memory for Gemma
  // 3's 262,144 rows). A FlashHead image reads a few clusters of rows per step (stage 2) and
  // keeps the dense head for perplexity and --head dense: the same int8 activations and bits,
  // from the rows as stored (no copy).
  // An image that stores the head's interleaved layout too (the GGUF image cache's,
  // image/auto_image.h) has it read in place.
  head_.weight = file.find_tensor(head::kCentroidsTensor) == nullptr
                     ? store_.with_int8_head(head_.weight, tied_ ? "token_embd.weight" : "output.weight")
                     : store_.with_int8_head_rows(head_.weight);
  head_.final_softcap = c.final_softcap;
  if (const auto order = head::find_row_order(file)) head_.set_row_order(*order);
  output_norm_ = store_.vector("output_norm.weight", c.d_model);

  if (c.ple_dim > 0) {
    const size_t width = c.n_layers() * c.ple_dim;
    ple_.table = PerLayerTable(file, store_, c.n_vocab, width);
    ple_.model_proj = store_.source_matrix("per_layer_model_proj.weight", width, c.d_model);
    ple_.proj_norm = store_.vector("per_layer_proj_norm.weight", c.ple_dim);
    ple_.n_layers = c.n_layers();
    ple_.dim = c.ple_dim;
    ple_.d_model = c.d_model;
    ple_.eps = c.rms_eps;
  }

  const float* rope_factors = nullptr;  // rope_freqs [n_rot / 2], shared by the layers that use it
  for (size_t il = 0; il < c.n_layers(); ++il) {
    const GemmaLayerConfig& lc = c.layers[il];
    const size_t hd = lc.head_dim;
    const size_t q_dim = c.n_heads * hd, kv_dim = lc.n_kv_heads * hd;
    Layer l;
    l.attn_norm = store_.vector(blk(il, "attn_norm"), c.d_model);
    l.wq = store_.matrix(blk(il, "attn_q"), q_dim, c.d_model);
    if (c.owns_kv(il)) {
      l.wk = store_.matrix(blk(il, "attn_k"), kv_dim, c.d_model);
      if (!c.v_optional || store_.has_matrix(blk(il, "attn_v"))) {
        l.wv = store_.matrix(blk(il, "attn_v"), kv_dim, c.d_model);
      }
    }
    l.q_norm = store_.vector(blk(il, "attn_q_norm"), hd);
    if (c.owns_kv(il)) l.k_norm = store_.vector(blk(il, "attn_k_norm"), hd);
    l.wo = store_.matrix(blk(il, "attn_output"), c.d_model, q_dim);
    l.post_attn_norm = store_.vector(blk(il, "post_attention_norm"), c.d_model);
    l.ffn_norm = store_.vector(blk(il, "ffn_norm"), c.d_model);
    l.gate = store_.matrix(blk(il, "ffn_gate"), lc.d_ff, c.d_model);
    l.up = store_.matrix(blk(il, "ffn_up"), lc.d_ff, c.d_model);
    l.down = store_.matrix(blk(il, "ffn_down"), c.d_model, lc.d_ff);
    l.post_ffn_norm = store_.vector(blk(il, "post_ffw_norm"), c.d_model);
    if (c.ple_dim > 0) {
      l.ple_gate = store_.matrix(blk(il, "inp_gate"), c.ple_dim, c.d_model);
      l.ple_proj = store_.matrix(blk(il, "proj"), c.d_model, c.ple_dim);
      l.ple_post_norm = store_.vector(blk(il, "post_norm"), c.d_model);
    }
    if (store_.has(blk(il, "layer_output_scale"))) l.out_scale = *store_.vector(blk(il, "layer_output_scale"), 1);
    if (!std::isfinite(l.out_scale)) {
      throw Error(c.architecture + ": layer_output_scale of layer " + std::to_string(il) + " is not finite");
    }
    if (lc.rope.freq_factors && rope_factors == nullptr && store_.has("rope_freqs.weight")) {
      rope_factors = store_.vector("rope_freqs.weight", lc.rope.n_rot / 2);
    }
    l.inv_freq = rope_inverse_frequencies(lc.rope.base, lc.rope.n_rot, lc.rope.freq_factors ? rope_factors : nullptr);
    const double position_scale = static_cast<double>(lc.rope.position_scale);
    const auto same = std::find_if(rope_tables_.begin(), rope_tables_.end(), [&](const RopeTable& t) {
      return t.inv_freq == l.inv_freq && t.position_scale == position_scale;
    });
    l.rope_table = static_cast<size_t>(same - rope_tables_.begin());
    if (same == rope_tables_.end()) rope_tables_.push_back({l.inv_freq, position_scale});
    layers_.push_back(std::move(l));
  }
  info_.architecture = c.architecture;
  info_.name = file.find_string("general.name").value_or("");
  info_.n_vocab = c.n_vocab;
  info_.d_model = c.d_model;
  info_.n_layers = c.n_layers();
  info_.context_length = c.context_length;
  info_.n_params = store_.n_params();
  info_.int8_matrices = store_.int8_matrices();
  info_.load_copy_bytes = store_.load_copy_bytes();
  info_.decode_weight_bytes = ple_.model_proj.bytes();
  bool invariant = !ple_.model_proj.present() || kernels::matmul_rows_invariant(ple_.model_proj);
  const auto note = [](std::vector<std::string>& labels, const kernels::Matrix& m, size_t tokens) {
    const std::string label = kernels::kernel_label(kernels::choose_kernel(m, tokens));
    if (std::find(labels.begin(), labels.end(), label) == labels.end()) labels.push_back(label);
  };
  for (const Layer& l : layers_) {
    for (const kernels::Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down, &l.ple_gate, &l.ple_proj}) {
      info_.decode_weight_bytes += m->bytes();
      if (!m->present()) continue;
      if (!kernels::matmul_rows_invariant(*m)) invariant = false;
      note(info_.layer_decode_kernels, *m, 1);
      note(info_.layer_prefill_kernels, *m, kernels::kTileMinTokens);
    }
  }
  info_.head_decode_kernel = kernels::kernel_label(kernels::choose_kernel(head_.weight, 1));
  info_.head_prefill_kernel = kernels::kernel_label(kernels::choose_kernel(head_.weight, kernels::kTileMinTokens));
  batch_exactness_ = invariant ? BatchExactness::kAnyRows : BatchExactness::kShortApart;
}

KvCache GemmaDecoder::new_cache(size_t n_ctx) const {
  const GemmaConfig& c = config_;
  if (n_ctx == 0 || n_ctx > c.context_length) {
    throw Error("context size " + std::to_string(n_ctx) + " is outside 1.." +
                std::to_string(c.context_length) + " for this model");
  }
  std::vector<LayerCacheSpec> specs;
  for (size_t il = 0; il < c.n_layers(); ++il) {
    const GemmaLayerConfig& l = c.layers[il];
    const size_t capacity = !c.owns_kv(il) ? 0 : l.sliding ? std::min(n_ctx, l.window + kMaxUbatch - 1) : n_ctx;
    specs.push_back({capacity, l.n_kv_heads * l.head_dim, l.window, l.head_dim});
  }
  return KvCache::allocate(n_ctx, specs, kv_types_);
}

void GemmaDecoder::check(std::span<const TokenId> tokens, const KvCache& cache) const {
  const GemmaConfig& c = config_;
  if (tokens.empty()) throw Error("forward: no tokens");
  if (cache.layers.size() != c.n_layers()) throw Error("forward: cache of another model");
  for (size_t il = 0; il < c.n_layers(); ++il) {
    if (cache.layers[il].stride != c.layers[il].n_kv_heads * c.layers[il].head_dim) {
      throw Error("forward: cache of another model");
    }
  }
  if (cache.n_past + tokens.size() > cache.n_ctx) {
    throw Error("the sequence needs " + std::to_string(cache.n_past + tokens.size()) +
                " positions but the context holds " + std::to_string(cache.n_ctx));
  }
  for (const TokenId t : tokens) {
    if (t < 0 || static_cast<size_t>(t) >= c.n_vocab) {
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(c.n_vocab) + ")");
    }
  }
}

void GemmaDecoder::forward_hidden(std::span<const TokenId> tokens, KvCache& cache, Logits which,
                                  float* hidden, ThreadPool& pool, ActivationObserver* observer) const {
  check(tokens, cache);
  const size_t d = config_.d_model;
  for (size_t start = 0, n = 0; start < tokens.size(); start += n) {
    n = std::min(kMaxUbatch, tokens.size() - start);
    // No last piece shorter than kTileMinTokens after a full one: it would take the decode
    // kernels, which round otherwise, and a prompt of 256 k + 1..7 tokens would not give the
    // tokens the server's scheduler (which cuts no such piece) gives.
    const size_t rest = tokens.size() - start - n;
    if (rest > 0 && rest < kernels::kTileMinTokens) n -= kernels::kTileMinTokens;
    float* out = nullptr;  // where this ubatch's hidden rows go, if anywhere
    if (which == Logits::kAll) out = hidden + start * d;
    if (which == Logits::kLast && start + n == tokens.size()) out = hidden;
    const Segment seg{0, n, cache.n_past, &cache, out};
    forward_chunk(tokens.subspan(start, n), {&seg, 1}, which, pool, observer);
  }
}

void GemmaDecoder::forward_batch(std::span<const BatchSequence> seqs, ThreadPool& pool) const {
  if (seqs.empty()) throw Error("forward_batch: no sequences");
  size_t total = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const BatchSequence& s = seqs[i];
    if (s.cache == nullptr) throw Error("forward_batch: sequence " + std::to_string(i) + " has no cache");
    for (size_t j = 0; j < i; ++j) {
      if (seqs[j].cache == s.cache) {
        throw Error("forward_batch: sequences " + std::to_string(j) + " and " + std::to_string(i) +
                    " share a cache");
      }
    }
    check(s.tokens, *s.cache);
    total += s.tokens.size();
  }
  if (total > kMaxUbatch) {
    throw Error("forward_batch: " + std::to_string(total) + " tokens, more than the " +
                std::to_string(kMaxUbatch) + " one pass takes");
  }
  std::vector<TokenId> tokens;
  std::vector<Segment> segs;
  tokens.reserve(total);
  segs.reserve(seqs.size());
  for (const BatchSequence& s : seqs) {
    segs.push_back({tokens.size(), s.tokens.size(), s.cache->n_past, s.cache, s.hidden, s.all_rows});
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
  }
  forward_chunk(tokens, segs, Logits::kLast, pool, nullptr);
}

void GemmaDecoder::token_embedding(TokenId token, float* out) const {
  if (token < 0 || static_cast<size_t>(token) >= config_.n_vocab) {
    throw Error("token id " + std::to_string(token) + " is outside the vocabulary (" + std::to_string(config_.n_vocab) + ")");
  }
  const size_t row = tied_ ? head_.row_of(token) : static_cast<size_t>(token);
  kernels::matrix_row(embedding_, row, out);
  kernels::scale_inplace(out, config_.embed_scale, config_.d_model);
}

void GemmaDecoder::forward_chunk(std::span<const TokenId> tokens, std::span<const Segment> segs,
                                 Logits which, ThreadPool& pool, ActivationObserver* observer) const {
  const GemmaConfig& c = config_;
  const size_t n = tokens.size(), d = c.d_model;
  Scratch s(c, n, rope_tables_.size());
  // x[t] = E[token_t] · sqrt(d_model); rows through the head's token -> row map when the
  // embedding is the tied head (FlashHead images store it in cluster order).
  pool.parallel_for(n, rows_grain(d), [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      const size_t row = tied_ ? head_.row_of(tokens[t]) : static_cast<size_t>(tokens[t]);
      kernels::matrix_row(embedding_, row, &s.x[t * d]);
      kernels::scale_inplace(&s.x[t * d], c.embed_scale, d);
    }
  });
  // Each row's (cos, sin) per RoPE table, once for all the layers that share it.
  const size_t max_rot = rope_stride();
  for (size_t k = 0; k < rope_tables_.size(); ++k) {
    const RopeTable& table = rope_tables_[k];
    pool.parallel_for(n, rows_grain(64 * table.inv_freq.size()), [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) {
        const Segment& seg = *(std::upper_bound(segs.begin(), segs.end(), t,
                                                [](size_t row, const Segment& sg) { return row < sg.first; }) - 1);
        const double pos = static_cast<double>(seg.pos0 + (t - seg.first));
        rope_cos_sin(table.inv_freq, pos * table.position_scale, &s.cos_sin[(k * n + t) * max_rot]);
      }
    });
  }
  if (c.ple_dim > 0) ple_.compute(tokens, s.x, s.pl, pool, observer);
  for (size_t il = 0; il < c.n_layers(); ++il) {
    attention_block(il, n, segs, s, pool, observer);
    mlp_block(il, n, s, pool, observer);
    if (c.ple_dim > 0) ple_block(il, n, s, pool, observer);
    if (layers_[il].out_scale != 1.0f) kernels::scale_inplace(s.x, layers_[il].out_scale, n * d);
  }
  // Each segment: its tokens into its cache, rms(x) · w_out of the rows `which` asks for.
  for (const Segment& seg : segs) {
    seg.cache->append(tokens.subspan(seg.first, seg.n), seg.n >= kernels::kTileMinTokens);
    if (seg.hidden == nullptr) continue;
    const size_t first = which == Logits::kAll || seg.all_rows ? 0 : seg.n - 1;
    for (size_t t = first; t < seg.n; ++t) {
      kernels::rms_norm(&s.x[(seg.first + t) * d], output_norm_, &seg.hidden[(t - first) * d], d, c.rms_eps);
    }
  }
}

void GemmaDecoder::attention_block(size_t il, size_t n, std::span<const Segment> segs, Scratch& s,
                                   ThreadPool& pool, ActivationObserver* observer) const {
  const GemmaConfig& c = config_;
  const GemmaLayerConfig& lc = c.layers[il];
  const Layer& l = layers_[il];
  const size_t d = c.d_model, hd = lc.head_dim, n_kv = lc.n_kv_heads, n_rot = lc.rope.n_rot;
  const size_t q_dim = c.n_heads * hd, kv_dim = n_kv * hd;
  const bool owns_kv = c.owns_kv(il);
  rms_norm_rows(s.x, l.attn_norm, s.xn, n, d, c.rms_eps, pool);
  if (observer) {
    observer->observe(blk(il, "attn_q"), s.xn, n, d);
    if (owns_kv) observer->observe(blk(il, "attn_k"), s.xn, n, d);
    if (owns_kv && l.wv.present()) observer->observe(blk(il, "attn_v"), s.xn, n, d);
  }
  kernels::MatmulOutput qkv[3] = {{&l.wq, s.q, q_dim}};
  size_t n_out = 1;
  if (owns_kv) qkv[n_out++] = {&l.wk, s.k, kv_dim};
  if (owns_kv && l.wv.present()) qkv[n_out++] = {&l.wv, s.v, kv_dim};
  kernels::matmul_same_input({qkv, n_out}, s.xn, n, d, pool);
  if (owns_kv && !l.wv.present()) std::copy_n(s.k, n * kv_dim, s.v);

  const size_t rope_row = rope_stride();
  // Per row: q/k norms per head, RoPE, the cache's stores (fp16, or q8's scales and
  // rounding): ~8 operations per float.
  pool.parallel_for(n, rows_grain(8 * (q_dim + 2 * kv_dim)), [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      const Segment& seg = *(std::upper_bound(segs.begin(), segs.end(), t,
                                              [](size_t row, const Segment& sg) { return row < sg.first; }) - 1);
      const size_t pos = seg.pos0 + (t - seg.first);
      const float* cos_sin = &s.cos_sin[(l.rope_table * n + t) * rope_row];
      float* qt = &s.q[t * q_dim];
      for (size_t h = 0; h < c.n_heads; ++h) kernels::rms_norm(qt + h * hd, l.q_norm, qt + h * hd, hd, c.rms_eps);
      kernels::rope_neox(qt, c.n_heads, hd, n_rot, cos_sin);
      if (lc.query_scale != 1.0f) kernels::scale_inplace(qt, lc.query_scale, q_dim);
      if (!owns_kv) continue;
      float* kt = &s.k[t * kv_dim];
      float* vt = &s.v[t * kv_dim];
      for (size_t h = 0; h < n_kv; ++h) kernels::rms_norm(kt + h * hd, l.k_norm, kt + h * hd, hd, c.rms_eps);
      if (c.v_norm) {
        for (size_t h = 0; h < n_kv; ++h) kernels::rms_norm_unweighted(vt + h * hd, vt + h * hd, hd, c.rms_eps);
      }
      kernels::rope_neox(kt, n_kv, hd, n_rot, cos_sin);
      LayerCache& cache = seg.cache->layers[il];
      const size_t slot = pos % cache.capacity;
      cache.k.write(slot, kt);
      cache.v.write(slot, vt);
    }
  });

  // Segments of prefill size attend by tiles; the rows of the others (decode rows, short
  // verification chunks) all in one parallel loop, each as it would alone.
  const bool int8_products = l.wq.interleaved_int8 != nullptr || l.wq.interleaved_q8 != nullptr;
  const AttentionShape shape{c.n_heads, n_kv, hd, lc.window, int8_products};
  thread_local std::vector<AttentionRow> rows;
  rows.clear();
  for (const Segment& seg : segs) {
    const LayerCache& cache = seg.cache->layers[lc.kv_source];
    if (seg.n >= kernels::kTileMinTokens) {
      cached_attention(shape, &s.q[seg.first * q_dim], seg.n, seg.pos0, cache, &s.attn[seg.first * q_dim], pool);
      continue;
    }
    for (size_t t = 0; t < seg.n; ++t) {
      rows.push_back({&s.q[(seg.first + t) * q_dim], seg.pos0 + t, &cache, &s.attn[(seg.first + t) * q_dim]});
    }
  }
  cached_attention_rows(shape, rows, pool);
  if (observer) observer->observe(blk(il, "attn_output"), s.attn, n, q_dim);
  kernels::matmul(l.wo, s.attn, n, q_dim, s.xn, d, pool);
  add_post_normed(s.x, s.xn, l.post_attn_norm, n, d, c.rms_eps, pool);
}

void GemmaDecoder::mlp_block(size_t il, size_t n, Scratch& s, ThreadPool& pool,
                             ActivationObserver* observer) const {
  const GemmaConfig& c = config_;
  const Layer& l = layers_[il];
  const size_t d = c.d_model, f = c.layers[il].d_ff;
  rms_norm_rows(s.x, l.ffn_norm, s.xn, n, d, c.rms_eps, pool);
  if (observer) {
    for (const char* m : {"ffn_gate", "ffn_up"}) observer->observe(blk(il, m), s.xn, n, d);
  }
  const kernels::MatmulOutput gate_up[] = {{&l.gate, s.gate, f}, {&l.up, s.up, f}};
  kernels::matmul_same_input(gate_up, s.xn, n, d, pool);
  pool.parallel_for(n, rows_grain(f), [&](size_t b, size_t e) {
    kernels::gelu_tanh_mul(&s.gate[b * f], &s.up[b * f], &s.gate[b * f], (e - b) * f);
  });
  if (observer) observer->observe(blk(il, "ffn_down"), s.gate, n, f);
  kernels::matmul(l.down, s.gate, n, f, s.xn, d, pool);
  add_post_normed(s.x, s.xn, l.post_ffn_norm, n, d, c.rms_eps, pool);
}

// x += rms(W_proj (gelu(W_gate x) · pl_i)) · w_post_norm, pl_i this layer's per-layer input.
void GemmaDecoder::ple_block(size_t il, size_t n, Scratch& s, ThreadPool& pool,
                             ActivationObserver* observer) const {
  const GemmaConfig& c = config_;
  const Layer& l = layers_[il];
  const size_t d = c.d_model, p = c.ple_dim, width = c.n_layers() * p;
  if (observer) observer->observe(blk(il, "inp_gate"), s.x, n, d);
  kernels::matmul(l.ple_gate, s.x, n, d, s.ple_gate, p, pool);
  for (size_t t = 0; t < n; ++t) {
    kernels::gelu_tanh_mul(&s.ple_gate[t * p], &s.pl[t * width + il * p], &s.ple_gate[t * p], p);
  }
  if (observer) observer->observe(blk(il, "proj"), s.ple_gate, n, p);
  kernels::matmul(l.ple_proj, s.ple_gate, n, p, s.xn, d, pool);
  add_post_normed(s.x, s.xn, l.ple_post_norm, n, d, c.rms_eps, pool);
}

}  // namespace kestrel::model
