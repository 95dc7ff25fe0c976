#include "kestrel/model/gemma_common.h"

#include <algorithm>
#include <cmath>

#include "kestrel/base/error.h"
#include "kestrel/kernels/ops.h"

namespace kestrel::model::gemma {

size_t positive(const gguf::File& file, const std::string& name) {
  const uint64_t v = file.get_uint(name);
  if (v == 0 || v > kMaxDim) throw Error("metadata " + name + " = " + std::to_string(v) + " is out of range");
  return static_cast<size_t>(v);
}

std::string blk(size_t il, const char* name) {
  return "blk." + std::to_string(il) + "." + name + ".weight";
}

std::vector<float> rope_inverse_frequencies(double base, size_t n_rot, const float* factors) {
  std::vector<float> f(n_rot / 2);
  for (size_t i = 0; i < f.size(); ++i) {
    double v = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
    if (factors != nullptr) v /= static_cast<double>(factors[i]);
    f[i] = static_cast<float>(v);
  }
  return f;
}

void rope_cos_sin(const std::vector<float>& inv_freq, double position, float* out) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double angle = position * static_cast<double>(inv_freq[i]);
    out[2 * i] = static_cast<float>(std::cos(angle));
    out[2 * i + 1] = static_cast<float>(std::sin(angle));
  }
}

void check_forward(std::span<const TokenId> tokens, const KvCache& cache, size_t n_layers, size_t n_vocab) {
  if (tokens.empty()) throw Error("forward: no tokens");
  if (cache.layers.size() != n_layers) throw Error("forward: cache of another model");
  if (cache.n_past + tokens.size() > cache.n_ctx) {
    throw Error("the sequence needs " + std::to_string(cache.n_past + tokens.size()) +
                " positions but the context holds " + std::to_string(cache.n_ctx));
  }
  for (TokenId t : tokens) {
    if (t < 0 || static_cast<size_t>(t) >= n_vocab) {
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(n_vocab) + ")");
    }
  }
}

const Segment& segment_of(std::span<const Segment> segs, size_t t) {
  const auto it = std::upper_bound(segs.begin(), segs.end(), t,
                                   [](size_t row, const Segment& s) { return row < s.first; });
  return *(it - 1);
}

void check_batch(std::span<const BatchSequence> seqs, size_t max_tokens,
                 const std::function<void(std::span<const TokenId>, const KvCache&)>& check) {
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
  if (total > max_tokens) {
    throw Error("forward_batch: " + std::to_string(total) + " tokens, more than the " +
                std::to_string(max_tokens) + " one pass takes");
  }
}

void gather_batch(std::span<const BatchSequence> seqs, std::vector<TokenId>& tokens,
                  std::vector<Segment>& segs) {
  tokens.clear();
  segs.clear();
  for (const BatchSequence& s : seqs) {
    segs.push_back({tokens.size(), s.tokens.size(), s.cache->n_past, s.cache, s.hidden});
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
  }
}

void for_each_ubatch(std::span<const TokenId> tokens, Logits which, float* hidden, size_t d_model,
                     size_t max_ubatch, const std::function<void(std::span<const TokenId>, float*)>& chunk) {
  for (size_t start = 0; start < tokens.size(); start += max_ubatch) {
    const size_t n = std::min(max_ubatch, tokens.size() - start);
    float* out = nullptr;
    if (which == Logits::kAll) out = hidden + start * d_model;
    if (which == Logits::kLast && start + n == tokens.size()) out = hidden;
    chunk(tokens.subspan(start, n), out);
  }
}

void embed(const kernels::Matrix& embedding, const head::OutputHead& head, bool tied,
           std::span<const TokenId> tokens, float scale, size_t d_model, float* x, ThreadPool& pool) {
  pool.parallel_for(tokens.size(), 1, [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      const size_t row = tied ? head.row_of(tokens[t]) : static_cast<size_t>(tokens[t]);
      kernels::matrix_row(embedding, row, &x[t * d_model]);
      kernels::scale_inplace(&x[t * d_model], scale, d_model);
    }
  });
}

void add_post_normed(float* x, float* y, const float* w, size_t n, size_t d, float eps, ThreadPool& pool) {
  pool.parallel_for(n, 1, [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      kernels::rms_norm(&y[t * d], w, &y[t * d], d, eps);
      kernels::add_inplace(&x[t * d], &y[t * d], d);
    }
  });
}

void geglu_mlp(const GegluMlp& w, size_t il, size_t n, size_t d, size_t f, float eps,
               std::vector<float>& x, ThreadPool& pool, ActivationObserver* observer) {
  std::vector<float> xn(n * d), gate(n * f), up(n * f);
  pool.parallel_for(n, 1, [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) kernels::rms_norm(&x[t * d], w.norm, &xn[t * d], d, eps);
  });
  if (observer) {
    for (const char* m : {"ffn_gate", "ffn_up"}) observer->observe(blk(il, m), xn.data(), n, d);
  }
  const kernels::MatmulOutput gate_up[] = {{&w.gate, gate.data(), f}, {&w.up, up.data(), f}};
  kernels::matmul_same_input(gate_up, xn.data(), n, d, pool);
  pool.parallel_for(n, 1, [&](size_t b, size_t e) {
    kernels::gelu_tanh_mul(&gate[b * f], &up[b * f], &gate[b * f], (e - b) * f);
  });
  if (observer) observer->observe(blk(il, "ffn_down"), gate.data(), n, f);
  kernels::matmul(w.down, gate.data(), n, f, xn.data(), d, pool);
  add_post_normed(x.data(), xn.data(), w.post_norm, n, d, eps, pool);
}

void final_norm(const float* x, const float* w, Logits which, size_t n, size_t d, float eps, float* hidden) {
  const size_t first = which == Logits::kAll ? 0 : n - 1;
  for (size_t t = first; t < n; ++t) kernels::rms_norm(&x[t * d], w, &hidden[(t - first) * d], d, eps);
}

void finish_segments(std::span<const TokenId> tokens, std::span<const Segment> segs, const float* x,
                     const float* w, Logits which, size_t d, float eps) {
  for (const Segment& s : segs) {
    s.cache->append(tokens.subspan(s.first, s.n));
    if (s.hidden != nullptr) final_norm(x + s.first * d, w, which, s.n, d, eps, s.hidden);
  }
}

}  // namespace kestrel::model::gemma
