#include "kestrel/model/mtp_assistant.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <variant>

#include "kestrel/base/error.h"
#include "kestrel/image/hf_gemma4_assistant.h"
#include "kestrel/kernels/ops.h"
#include "kestrel/model/attention.h"

namespace kestrel::model {
namespace {

namespace keys = image::mtp_keys;
constexpr uint64_t kMaxDim = 1u << 20;

std::string mtp_blk(size_t il, const char* name) {
  return image::mtp_name("blk." + std::to_string(il) + "." + name + ".weight");
}

size_t positive(const gguf::File& f, const char* key) {
  const uint64_t v = f.get_uint(key);
  if (v == 0 || v > kMaxDim) throw Error(std::string("gemma4_assistant: ") + key + " is out of range");
  return static_cast<size_t>(v);
}

std::vector<size_t> per_layer(const gguf::File& f, const char* key, size_t n) {
  const std::vector<int64_t> raw = f.get_int_array(key);
  if (raw.size() != n) throw Error(std::string("gemma4_assistant: ") + key + " must have one entry per layer");
  std::vector<size_t> out;
  for (const int64_t v : raw) {
    if (v <= 0 || static_cast<uint64_t>(v) > kMaxDim) throw Error(std::string("gemma4_assistant: ") + key + " is out of range");
    out.push_back(static_cast<size_t>(v));
  }
  return out;
}

float dot(const float* a, const float* b, size_t n) {
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

std::optional<MtpAssistantConfig> MtpAssistantConfig::from_gguf(const gguf::File& f) {
  if (!f.has(keys::kBlockCount)) return std::nullopt;
  MtpAssistantConfig c;
  c.n_layers = positive(f, keys::kBlockCount);
  c.d_model = positive(f, keys::kEmbeddingLength);
  c.d_backbone = positive(f, keys::kBackboneLength);
  c.d_ff = positive(f, keys::kFeedForwardLength);
  c.n_heads = positive(f, keys::kHeadCount);
  c.window = positive(f, keys::kSlidingWindow);
  c.n_centroids = static_cast<size_t>(f.find_uint(keys::kCentroids).value_or(0));
  c.centroid_top_k = static_cast<size_t>(f.find_uint(keys::kCentroidTopK).value_or(0));
  c.rotated_pairs = static_cast<size_t>(f.get_uint(keys::kRopeRotatedPairs));
  c.rms_eps = static_cast<float>(f.get_float(keys::kRmsEps));
  c.rope_base = f.get_float(keys::kRopeBase);
  c.rope_base_swa = f.get_float(keys::kRopeBaseSwa);
  c.head_dim = per_layer(f, keys::kKeyLength, c.n_layers);
  c.n_kv_heads = per_layer(f, keys::kHeadCountKv, c.n_layers);
  const gguf::Array& pattern = f.get_array(keys::kSlidingPattern);
  const auto* sliding = std::get_if<std::vector<uint8_t>>(&pattern.items);
  if (sliding == nullptr || sliding->size() != c.n_layers) {
    throw Error("gemma4_assistant: attention.sliding_window_pattern must be one bool per layer");
  }
  for (const uint8_t s : *sliding) c.sliding.push_back(s != 0);
  for (size_t il = 0; il < c.n_layers; ++il) {
    if (c.head_dim[il] % 2 != 0 || c.n_heads % c.n_kv_heads[il] != 0) {
      throw Error("gemma4_assistant: layer " + std::to_string(il) + " has an odd head size or a head count that is not a multiple of its KV heads");
    }
    if (!c.sliding[il] && 2 * c.rotated_pairs > c.head_dim[il]) throw Error("gemma4_assistant: rope.rotated_pairs exceeds the head size");
  }
  if (!(c.rope_base > 1.0) || !(c.rope_base_swa > 1.0)) throw Error("gemma4_assistant: a RoPE base is not above 1");
  if (!(c.rms_eps > 0.0f)) throw Error("gemma4_assistant: the RMS norm epsilon must be positive");
  if (c.n_centroids > 0 && (c.centroid_top_k == 0 || c.centroid_top_k > c.n_centroids)) {
    throw Error("gemma4_assistant: centroid_top_k must be in 1..centroids");
  }
  return c;
}

bool MtpAssistant::in_file(const gguf::File& file) { return file.has(keys::kBlockCount); }

MtpAssistant::MtpAssistant(const gguf::File& file, const GemmaDecoder& target, const LoadOptions& options,
                           ThreadPool& pool)
    : target_(&target), store_(file, options, pool) {
  const auto cfg = MtpAssistantConfig::from_gguf(file);
  if (!cfg) throw Error("the model file has no Gemma 4 MTP assistant (no " + std::string(keys::kBlockCount) + ")");
  config_ = *cfg;
  const MtpAssistantConfig& c = config_;
  const GemmaConfig& t = target.config();
  n_vocab_ = t.n_vocab;
  if (c.d_backbone != t.d_model) {
    throw Error("gemma4_assistant: backbone width " + std::to_string(c.d_backbone) + " is not the target's " + std::to_string(t.d_model));
  }
  const size_t d = c.d_model, D = c.d_backbone;
  output_ = store_.source_matrix(image::mtp_name(store_.has(image::mtp_name("output.weight")) ? "output.weight" : "token_embd.weight"),
                                 n_vocab_, d);
  output_norm_ = store_.vector(image::mtp_name("output_norm.weight"), d);
  pre_proj_ = store_.source_matrix(image::mtp_name("pre_proj.weight"), d, 2 * D);
  post_proj_ = store_.source_matrix(image::mtp_name("post_proj.weight"), D, d);
  if (c.n_centroids > 0) {
    if (n_vocab_ % c.n_centroids != 0) throw Error("gemma4_assistant: the centroids do not divide the vocabulary");
    centroids_ = store_.source_matrix(image::mtp_name("centroids.weight"), c.n_centroids, d);
    const float* order = store_.vector(image::mtp_name("token_ordering.weight"), n_vocab_);
    token_ordering_.resize(n_vocab_);
    for (size_t i = 0; i < n_vocab_; ++i) {
      const float v = order[i];
      if (!(v >= 0.0f && v < static_cast<float>(n_vocab_)) || v != std::floor(v)) {
        throw Error("gemma4_assistant: token_ordering holds " + std::to_string(v) + ", not a token id");
      }
      token_ordering_[i] = static_cast<uint32_t>(v);
    }
  }
  for (size_t il = 0; il < c.n_layers; ++il) {
    const size_t hd = c.head_dim[il], q_dim = c.n_heads * hd;
    Layer l;
    // The target's last KV-owning layer of this type (HF: the "store" layer of the type).
    bool found = false;
    for (size_t j = 0; j < t.n_layers(); ++j) {
      if (t.owns_kv(j) && t.layers[j].sliding == c.sliding[il]) {
        l.kv_layer = j;
        found = true;
      }
    }
    if (!found) throw Error("gemma4_assistant: the target has no " + std::string(c.sliding[il] ? "sliding" : "full") + " layer to read");
    const GemmaLayerConfig& src = t.layers[l.kv_layer];
    if (src.head_dim != hd || src.n_kv_heads != c.n_kv_heads[il]) {
      throw Error("gemma4_assistant: layer " + std::to_string(il) + " expects K/V of " + std::to_string(c.n_kv_heads[il]) +
                  " heads of " + std::to_string(hd) + "; the target's layer " + std::to_string(l.kv_layer) + " has " +
                  std::to_string(src.n_kv_heads) + " of " + std::to_string(src.head_dim));
    }
    l.attn_norm = store_.vector(mtp_blk(il, "attn_norm"), d);
    l.wq = store_.source_matrix(mtp_blk(il, "attn_q"), q_dim, d);
    l.q_norm = store_.vector(mtp_blk(il, "attn_q_norm"), hd);
    l.wo = store_.source_matrix(mtp_blk(il, "attn_output"), d, q_dim);
    l.post_attn_norm = store_.vector(mtp_blk(il, "post_attention_norm"), d);
    l.ffn_norm = store_.vector(mtp_blk(il, "ffn_norm"), d);
    l.gate = store_.source_matrix(mtp_blk(il, "ffn_gate"), c.d_ff, d);
    l.up = store_.source_matrix(mtp_blk(il, "ffn_up"), c.d_ff, d);
    l.down = store_.source_matrix(mtp_blk(il, "ffn_down"), d, c.d_ff);
    l.post_ffn_norm = store_.vector(mtp_blk(il, "post_ffw_norm"), d);
    if (store_.has(mtp_blk(il, "layer_output_scale"))) l.out_scale = *store_.vector(mtp_blk(il, "layer_output_scale"), 1);
    if (!std::isfinite(l.out_scale)) throw Error("gemma4_assistant: layer_output_scale of layer " + std::to_string(il) + " is not finite");
    // RoPE over the whole head (NeoX halves); full layers rotate the first rotated_pairs
    // frequencies and leave the rest at angle 0 (HF's proportional RoPE).
    const double base = c.sliding[il] ? c.rope_base_swa : c.rope_base;
    const size_t rotated = c.sliding[il] ? hd / 2 : c.rotated_pairs;
    l.inv_freq.assign(hd / 2, 0.0f);
    for (size_t i = 0; i < rotated; ++i) {
      l.inv_freq[i] = static_cast<float>(1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(hd)));
    }
    layers_.push_back(std::move(l));
  }
}

void MtpAssistant::head(const float* n, float* logits, ThreadPool& pool) const {
  const MtpAssistantConfig& c = config_;
  const size_t d = c.d_model;
  if (c.n_centroids == 0) {
    kernels::matmul(output_, n, 1, d, logits, n_vocab_, pool);
    return;
  }
  std::vector<float> cl(c.n_centroids);
  kernels::matmul(centroids_, n, 1, d, cl.data(), c.n_centroids, pool);
  std::vector<size_t> order(c.n_centroids);
  std::iota(order.begin(), order.end(), size_t{0});
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(c.centroid_top_k), order.end(),
                    [&](size_t a, size_t b) { return cl[a] > cl[b] || (cl[a] == cl[b] && a < b); });
  const size_t per = n_vocab_ / c.n_centroids;
  std::vector<float> row(d);
  std::vector<std::pair<uint32_t, float>> chosen;
  chosen.reserve(c.centroid_top_k * per);
  float lowest = INFINITY;
  for (size_t k = 0; k < c.centroid_top_k; ++k) {
    for (size_t j = 0; j < per; ++j) {
      const uint32_t token = token_ordering_[order[k] * per + j];
      kernels::matrix_row(output_, token, row.data());
      const float z = dot(row.data(), n, d);
      chosen.emplace_back(token, z);
      lowest = std::min(lowest, z);
    }
  }
  std::fill(logits, logits + n_vocab_, lowest - 1.0f);
  for (const auto& [token, z] : chosen) logits[token] = z;
}

void MtpAssistant::step(TokenId token, const float* hidden, const KvCache& cache, float* logits, float* next_hidden,
                        ThreadPool& pool) const {
  const MtpAssistantConfig& c = config_;
  const GemmaConfig& t = target_->config();
  const size_t d = c.d_model, D = c.d_backbone, p = cache.n_past;
  if (p == 0) throw Error("MTP assistant: the target's cache is empty (the assistant reads its keys and values)");
  if (cache.layers.size() != t.n_layers()) throw Error("MTP assistant: a cache of another model");
  for (const Layer& l : layers_) {
    const LayerCache& lc = cache.layers[l.kv_layer];
    if (lc.stride != t.layers[l.kv_layer].n_kv_heads * t.layers[l.kv_layer].head_dim) throw Error("MTP assistant: a cache of another model");
    if (lc.capacity < cache.n_ctx) {  // a sliding ring: it must still hold p - 1 - W
      const size_t first = p > c.window + 1 ? p - 1 - c.window : 0;
      if (lc.capacity < c.window + 1 || first < cache.ring_floor()) {
        throw Error("MTP assistant: the target's sliding-window cache no longer holds position " + std::to_string(first));
      }
    }
  }
  std::vector<float> in(2 * D), x(d), a(d), y(d);
  target_->token_embedding(token, in.data());
  std::copy_n(hidden, D, in.begin() + static_cast<std::ptrdiff_t>(D));
  kernels::matmul(pre_proj_, in.data(), 1, 2 * D, x.data(), d, pool);
  for (size_t il = 0; il < c.n_layers; ++il) {
    const Layer& l = layers_[il];
    const size_t hd = c.head_dim[il], q_dim = c.n_heads * hd;
    std::vector<float> q(q_dim), o(q_dim), cos_sin(hd), g(c.d_ff), u(c.d_ff);
    kernels::rms_norm(x.data(), l.attn_norm, a.data(), d, c.rms_eps);
    kernels::matmul(l.wq, a.data(), 1, d, q.data(), q_dim, pool);
    for (size_t h = 0; h < c.n_heads; ++h) kernels::rms_norm(&q[h * hd], l.q_norm, &q[h * hd], hd, c.rms_eps);
    for (size_t i = 0; i < hd / 2; ++i) {
      const float angle = static_cast<float>(p) * l.inv_freq[i];  // float32, as HF computes it
      cos_sin[2 * i] = std::cos(angle);
      cos_sin[2 * i + 1] = std::sin(angle);
    }
    kernels::rope_neox(q.data(), c.n_heads, hd, hd, cos_sin.data());
    // The query "stands at" p - 1 for the cache's causal mask: it sees positions up to p - 1,
    // and, on sliding layers, the W + 1 positions p - 1 - W .. p - 1.
    const AttentionShape shape{c.n_heads, c.n_kv_heads[il], hd, c.sliding[il] ? c.window + 1 : 0};
    cached_attention(shape, q.data(), 1, p - 1, cache.layers[l.kv_layer], o.data(), pool);
    kernels::matmul(l.wo, o.data(), 1, q_dim, y.data(), d, pool);
    kernels::rms_norm(y.data(), l.post_attn_norm, y.data(), d, c.rms_eps);
    kernels::add_inplace(x.data(), y.data(), d);
    kernels::rms_norm(x.data(), l.ffn_norm, a.data(), d, c.rms_eps);
    kernels::matmul(l.gate, a.data(), 1, d, g.data(), c.d_ff, pool);
    kernels::matmul(l.up, a.data(), 1, d, u.data(), c.d_ff, pool);
    kernels::gelu_tanh_mul(g.data(), u.data(), g.data(), c.d_ff);
    kernels::matmul(l.down, g.data(), 1, c.d_ff, y.data(), d, pool);
    kernels::rms_norm(y.data(), l.post_ffn_norm, y.data(), d, c.rms_eps);
    kernels::add_inplace(x.data(), y.data(), d);
    if (l.out_scale != 1.0f) kernels::scale_inplace(x.data(), l.out_scale, d);
  }
  kernels::rms_norm(x.data(), output_norm_, a.data(), d, c.rms_eps);
  head(a.data(), logits, pool);
  std::vector<float> h(D);
  kernels::matmul(post_proj_, a.data(), 1, d, h.data(), D, pool);
  std::copy(h.begin(), h.end(), next_hidden);
}

std::vector<TokenId> MtpAssistant::draft(TokenId token, const float* hidden, const KvCache& cache, size_t n,
                                         ThreadPool& pool, std::vector<float>* logits) const {
  std::vector<TokenId> out;
  std::vector<float> h(hidden, hidden + config_.d_backbone), z(n_vocab_);
  if (logits != nullptr) logits->assign(n * n_vocab_, 0.0f);
  for (size_t k = 0; k < n; ++k) {
    step(token, h.data(), cache, z.data(), h.data(), pool);
    token = static_cast<TokenId>(std::max_element(z.begin(), z.end()) - z.begin());
    out.push_back(token);
    if (logits != nullptr) std::copy(z.begin(), z.end(), logits->begin() + static_cast<std::ptrdiff_t>(k * n_vocab_));
  }
  return out;
}

}  // namespace kestrel::model
