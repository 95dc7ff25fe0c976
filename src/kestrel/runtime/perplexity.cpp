#include "kestrel/runtime/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "kestrel/base/error.h"

namespace kestrel::runtime {
namespace {

using Clock = std::chrono::steady_clock;

struct RowSummary {
  size_t argmax = 0;
  double max = 0;
  double lse = 0;  // log-sum-exp
};

size_t argmax_of(std::span<const float> x) {
  size_t best = 0;
  for (size_t i = 1; i < x.size(); ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

RowSummary summarize(std::span<const float> x) {
  RowSummary s;
  s.argmax = argmax_of(x);
  s.max = x[s.argmax];
  double sum = 0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - s.max);
  s.lse = s.max + std::log(sum);
  return s;
}

struct BaseRow {
  RowSummary summary;
  double kl = 0;  // KL(softmax(base) || softmax(model))
};

// One exp pass over the base row gives both its log-sum-exp and the KL divergence. With
// e_i = exp(b_i - max_b), S = sum e_i, T = sum e_i (b_i - m_i) and p_i = e_i / S:
// KL = sum p_i ((b_i - lse_b) - (m_i - lse_m)) = T / S - lse_b + lse_m.
BaseRow base_row(std::span<const float> b, std::span<const float> m, const RowSummary& sm) {
  BaseRow r;
  r.summary.argmax = argmax_of(b);
  r.summary.max = b[r.summary.argmax];
  double s = 0, t = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double bi = b[i];
    const double e = std::exp(bi - r.summary.max);
    s += e;
    t += e * (bi - static_cast<double>(m[i]));
  }
  r.summary.lse = r.summary.max + std::log(s);
  r.kl = std::max(0.0, t / s - r.summary.lse + sm.lse);
  return r;
}

void check_options(const Engine& model, size_t n_tokens, const PerplexityOptions& o) {
  const size_t max_ctx = model.model().info().context_length;
  if (o.n_ctx < 4) {
    throw Error("perplexity needs a context of at least 4 tokens (got " + std::to_string(o.n_ctx) + ")");
  }
  if (o.n_ctx > max_ctx) {
    throw Error("a context of " + std::to_string(o.n_ctx) +
                " tokens is larger than the model allows (" + std::to_string(max_ctx) + ")");
  }
  if (n_tokens < 2 * o.n_ctx) {
    throw Error("the text has " + std::to_string(n_tokens) + (n_tokens == 1 ? " token" : " tokens") +
                "; perplexity with a context of " + std::to_string(o.n_ctx) +
                " needs at least " + std::to_string(2 * o.n_ctx) + " (2 x context)");
  }
}

// Running sums over scored positions, in chunk order (so results do not depend on threads).
struct Accumulator {
  double sum_nll = 0, sum_nll2 = 0;
  double sum_nll_base = 0, sum_nll_base2 = 0;
  double sum_kl = 0, sum_kl2 = 0;
  size_t same_top = 0;
  size_t count = 0;
  std::vector<double> kl_values;

  void fill(PerplexityResult& r, bool final_stats) const {
    r.n_scored = count;
    const auto e = estimate_perplexity(sum_nll, sum_nll2, count);
    r.ppl = e.ppl;
    r.ppl_error = e.error;
    if (!r.has_base || count == 0) return;
    const auto eb = estimate_perplexity(sum_nll_base, sum_nll_base2, count);
    r.base_ppl = eb.ppl;
    r.base_ppl_error = eb.error;
    const double n = static_cast<double>(count);
    r.kl_mean = sum_kl / n;
    const double var = sum_kl2 / n - r.kl_mean * r.kl_mean;
    r.kl_mean_error = var > 0 && count > 1 ? std::sqrt(var / (n - 1)) : 0.0;
    r.same_top1_pct = 100.0 * static_cast<double>(same_top) / n;
    r.kl_max = kl_values.empty() ? 0.0 : *std::max_element(kl_values.begin(), kl_values.end());
    if (final_stats) {
      std::vector<double> sorted = kl_values;
      std::sort(sorted.begin(), sorted.end());
      r.kl_p99 = percentile(sorted, 0.99);
    }
  }
};

PerplexityResult run(Engine& model, Engine* base, std::span<const model::TokenId> tokens,
                     const PerplexityOptions& o, const PerplexityProgress& progress) {
  check_options(model, tokens.size(), o);
  const size_t n_vocab = model.model().info().n_vocab;
  if (base != nullptr && base->model().info().n_vocab != n_vocab) {
    throw Error("the model's vocabulary has " + std::to_string(n_vocab) +
                " tokens but the base model's has " +
                std::to_string(base->model().info().n_vocab) + "; KL divergence needs the same vocabulary");
  }
  if (base != nullptr) {
    const auto& a = model.tokenizer();
    const auto& b = base->tokenizer();
    for (size_t id = 0; id < a.n_vocab() && id < b.n_vocab(); ++id) {
      const auto t = static_cast<model::TokenId>(id);
      if (a.piece(t) != b.piece(t)) {
        throw Error("the model and the base model differ at token " + std::to_string(id) + " ('" +
                    a.piece(t) + "' vs '" + b.piece(t) + "'); KL divergence needs the same vocabulary");
      }
    }
  }
  const auto t0 = Clock::now();
  const size_t n_ctx = o.n_ctx;
  const size_t first = n_ctx / 2;
  const size_t rows_per_pass = std::max<size_t>(1, o.rows_per_pass);
  size_t n_chunks = tokens.size() / n_ctx;
  if (o.max_chunks > 0) n_chunks = std::min(n_chunks, o.max_chunks);

  PerplexityResult result;
  result.n_ctx = n_ctx;
  result.n_tokens = tokens.size();
  result.has_base = base != nullptr;

  model::KvCache cache = model.model().new_cache(n_ctx);
  model::KvCache base_cache;
  if (base) base_cache = base->model().new_cache(n_ctx);
  std::vector<float> logits(rows_per_pass * n_vocab), base_logits;
  if (base) base_logits.resize(rows_per_pass * n_vocab);
  std::vector<float> last(n_vocab);  // kLast output of the unscored first half (unused)
  std::vector<double> nll(rows_per_pass), nll_base(rows_per_pass), kl(rows_per_pass);
  std::vector<char> same(rows_per_pass);
  std::vector<model::TokenId> chunk(n_ctx);
  const bool add_bos = model.tokenizer().add_bos();
  const model::TokenId bos = model.tokenizer().bos();

  Accumulator acc;
  for (size_t c = 0; c < n_chunks; ++c) {
    const auto chunk_tokens = tokens.subspan(c * n_ctx, n_ctx);
    std::copy(chunk_tokens.begin(), chunk_tokens.end(), chunk.begin());
    if (add_bos) chunk[0] = bos;
    const std::span<const model::TokenId> ids(chunk);

    // The first half only fills the KV cache. The last token predicts nothing that is scored,
    // so it is never evaluated.
    cache.clear();
    model.model().forward(ids.first(first), cache, model::Logits::kLast, last.data(), model.pool());
    if (base) {
      base_cache.clear();
      base->model().forward(ids.first(first), base_cache, model::Logits::kLast, last.data(), base->pool());
    }
    for (size_t pos = first; pos < n_ctx - 1; pos += rows_per_pass) {
      const size_t rows = std::min(rows_per_pass, n_ctx - 1 - pos);
      const auto part = ids.subspan(pos, rows);
      model.model().forward(part, cache, model::Logits::kAll, logits.data(), model.pool());
      if (base) base->model().forward(part, base_cache, model::Logits::kAll, base_logits.data(), base->pool());
      model.pool().parallel_for(rows, 1, [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r) {
          const auto target = static_cast<size_t>(chunk_tokens[pos + r + 1]);
          const std::span<const float> m(&logits[r * n_vocab], n_vocab);
          const RowSummary sm = summarize(m);
          nll[r] = sm.lse - static_cast<double>(m[target]);
          if (!base) continue;
          const std::span<const float> bl(&base_logits[r * n_vocab], n_vocab);
          const BaseRow br = base_row(bl, m, sm);
          nll_base[r] = br.summary.lse - static_cast<double>(bl[target]);
          kl[r] = br.kl;
          same[r] = sm.argmax == br.summary.argmax;
        }
      });
      for (size_t r = 0; r < rows; ++r) {
        acc.sum_nll += nll[r];
        acc.sum_nll2 += nll[r] * nll[r];
        ++acc.count;
        if (!base) continue;
        acc.sum_nll_base += nll_base[r];
        acc.sum_nll_base2 += nll_base[r] * nll_base[r];
        acc.sum_kl += kl[r];
        acc.sum_kl2 += kl[r] * kl[r];
        acc.same_top += same[r] ? 1 : 0;
        acc.kl_values.push_back(kl[r]);
      }
    }
    result.n_chunks = c + 1;
    if (progress) {
      acc.fill(result, /*final_stats=*/false);
      result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      progress(c + 1, n_chunks, result);
    }
  }
  acc.fill(result, /*final_stats=*/true);
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

}  // namespace

PerplexityResult perplexity(Engine& model, std::span<const model::TokenId> tokens,
                            const PerplexityOptions& options, const PerplexityProgress& progress) {
  return run(model, nullptr, tokens, options, progress);
}

PerplexityResult perplexity(Engine& model, Engine& base, std::span<const model::TokenId> tokens,
                            const PerplexityOptions& options, const PerplexityProgress& progress) {
  return run(model, &base, tokens, options, progress);
}

double log_sum_exp(std::span<const float> logits) {
  if (logits.empty()) throw Error("log_sum_exp: no logits");
  return summarize(logits).lse;
}

std::vector<double> log_softmax(std::span<const float> logits) {
  const double lse = log_sum_exp(logits);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
  return out;
}

double negative_log_likelihood(std::span<const float> logits, model::TokenId token) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) {
    throw Error("negative_log_likelihood: token " + std::to_string(token) + " is outside the logits");
  }
  return log_sum_exp(logits) - static_cast<double>(logits[static_cast<size_t>(token)]);
}

double kl_divergence(std::span<const float> base_logits, std::span<const float> logits) {
  if (base_logits.empty() || base_logits.size() != logits.size()) {
    throw Error("kl_divergence: the two rows of logits differ in size or are empty");
  }
  return base_row(base_logits, logits, summarize(logits)).kl;
}

double percentile(std::span<const double> sorted, double fraction) {
  if (sorted.empty()) return 0;
  if (fraction <= 0) return sorted.front();
  if (fraction >= 1) return sorted.back();
  double p = fraction * static_cast<double>(sorted.size() - 1);
  const auto ip = static_cast<size_t>(p);
  p -= static_cast<double>(ip);
  return (1 - p) * sorted[ip] + p * sorted[std::min(ip + 1, sorted.size() - 1)];
}

PerplexityEstimate estimate_perplexity(double sum_nll, double sum_nll2, size_t count) {
  if (count == 0) return {};
  const double n = static_cast<double>(count);
  const double mean = sum_nll / n;
  PerplexityEstimate e;
  e.ppl = std::exp(mean);
  const double var = sum_nll2 / n - mean * mean;
  e.error = var > 0 && count > 1 ? e.ppl * std::sqrt(var / (n - 1)) : 0.0;
  return e;
}

}  // namespace kestrel::runtime
