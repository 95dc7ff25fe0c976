// Speculative sampling's acceptance rule (runtime/speculative_sampling.h), statistically: for
// fixed target and draft distributions p and q on a small vocabulary, many (200k) drafts drawn
// from q and decided by speculative_accept must emit tokens distributed as p. The check: the
// chi-square statistic of the emitted counts against p below the chi-square quantile at
// alpha = 1e-6 (Wilson-Hilferty approximation, conservative for few degrees of freedom), and
// the total-variation distance below 0.005 (sampling noise at 200k draws is ~0.001). Tokens
// outside p's support must never come out. A broken rule (resampling from p instead of the
// residual max(0, p - q)) fails the same check, so the check can fail. With q a point mass the
// rule must give the same joint distribution of (kept?, token) as the exact rule ("keep the
// draft iff the sampler draws it").
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/runtime/speculative_sampling.h"

namespace kestrel::runtime {
namespace {

constexpr size_t kDraws = 200000;
constexpr double kMaxTv = 0.005;

// The chi-square quantile at 1 - 1e-6 for `df` degrees of freedom (Wilson-Hilferty).
double chi2_critical(size_t df) {
  const double z = 4.753424;  // the standard normal's quantile at 1 - 1e-6
  const double k = static_cast<double>(df), a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

struct Fit {
  double chi2 = 0, critical = 0, tv = 0;
  size_t outside = 0;  // draws of tokens p gives probability 0
};

Fit fit(const std::map<TokenId, size_t>& counts, const TokenDistribution& p, size_t n) {
  Fit f;
  size_t df = 0;
  for (const auto& [t, pt] : p) {
    const auto it = counts.find(t);
    const double c = it == counts.end() ? 0.0 : static_cast<double>(it->second), e = pt * static_cast<double>(n);
    if (pt > 0) {
      f.chi2 += (c - e) * (c - e) / e;
      ++df;
    }
    f.tv += 0.5 * std::fabs(c / static_cast<double>(n) - pt);
  }
  for (const auto& [t, c] : counts) {
    if (probability_of(p, t) <= 0) {
      f.outside += c;
      f.tv += 0.5 * static_cast<double>(c) / static_cast<double>(n);
    }
  }
  f.critical = chi2_critical(df > 1 ? df - 1 : 1);
  return f;
}

struct Case {
  std::string name;
  TokenDistribution p, q;
};

std::vector<Case> cases() {
  return {
      {"q uniform, p peaked (q has mass where p has none)",
       {{0, 0.5}, {1, 0.25}, {2, 0.125}, {3, 0.0625}, {4, 0.0625}},
       {{0, 0.125}, {1, 0.125}, {2, 0.125}, {3, 0.125}, {4, 0.125}, {5, 0.125}, {6, 0.125}, {7, 0.125}}},
      {"q mostly where p has none", {{0, 0.6}, {1, 0.4}}, {{0, 0.1}, {2, 0.5}, {3, 0.4}}},
      {"q sharper than p", {{0, 0.3}, {1, 0.3}, {2, 0.2}, {3, 0.2}}, {{0, 0.9}, {1, 0.05}, {2, 0.05}}},
      {"q flatter than p", {{3, 0.85}, {1, 0.1}, {2, 0.05}}, {{1, 0.25}, {2, 0.25}, {3, 0.25}, {4, 0.25}}},
      {"q == p", {{0, 0.4}, {1, 0.3}, {2, 0.2}, {3, 0.1}}, {{0, 0.4}, {1, 0.3}, {2, 0.2}, {3, 0.1}}},
      {"disjoint supports", {{0, 0.5}, {1, 0.3}, {2, 0.2}}, {{5, 0.7}, {6, 0.3}}},
      {"point mass q on a likely token", {{0, 0.5}, {1, 0.3}, {2, 0.2}}, {{0, 1.0}}},
      {"point mass q on an unlikely token", {{0, 0.5}, {1, 0.3}, {2, 0.15}, {3, 0.05}}, {{3, 1.0}}},
      {"point mass q where p has none", {{0, 0.5}, {1, 0.3}, {2, 0.2}}, {{7, 1.0}}},
      {"point mass p (greedy) and a spread q", {{2, 1.0}}, {{0, 0.3}, {1, 0.3}, {2, 0.4}}},
  };
}

// Draws kDraws drafts from q and decides each with `rule`; returns the emitted counts.
template <typename Rule>
std::map<TokenId, size_t> emitted(const Case& c, Rule rule, uint64_t seed, size_t* accepted = nullptr) {
  std::mt19937_64 draft_rng(seed), rng(seed + 1);
  std::map<TokenId, size_t> counts;
  size_t kept = 0;
  for (size_t i = 0; i < kDraws; ++i) {
    const TokenId x = draw_token(c.q, draft_rng);
    const SpeculativeOutcome o = rule(c.p, c.q, x, rng);
    if (o.accepted) {
      EXPECT_EQ(o.token, x);
      ++kept;
    } else {
      EXPECT_NE(o.token, x) << "a rejected draft is never emitted";
    }
    ++counts[o.token];
  }
  if (accepted) *accepted = kept;
  return counts;
}

TEST(SpeculativeSampling, EmitsTokensDistributedAsTheTarget) {
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    size_t accepted = 0;
    const auto counts = emitted(c, speculative_accept, seed += 7, &accepted);
    const Fit f = fit(counts, c.p, kDraws);
    EXPECT_EQ(f.outside, 0u);
    EXPECT_LT(f.chi2, f.critical);
    EXPECT_LT(f.tv, kMaxTv);
    // Acceptance happens with probability sum_t min(p(t), q(t)) (Leviathan et al., Theorem 3.5).
    double expected = 0;
    for (const auto& [t, qt] : c.q) expected += std::min(qt, probability_of(c.p, t));
    const double n = static_cast<double>(kDraws), sd = std::sqrt(expected * (1 - expected) / n);
    EXPECT_NEAR(static_cast<double>(accepted) / n, expected, 5 * sd + 1e-12);
  }
}

// The classic mistake: on rejection, draw from p instead of the residual. The check must see it
// wherever q differs from p (here: every case with a rejection probability that matters).
TEST(SpeculativeSampling, TheCheckCatchesResamplingFromTheTarget) {
  const auto broken = [](const TokenDistribution& p, const TokenDistribution& q, TokenId x, std::mt19937_64& rng) {
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    if (u * probability_of(q, x) < probability_of(p, x)) return SpeculativeOutcome{x, true};
    TokenId t = x;
    while (t == x) t = draw_token(p, rng);  // (keeps "a rejected draft is never emitted")
    return SpeculativeOutcome{t, false};
  };
  const auto all = cases();
  for (size_t i : {0, 1, 2}) {
    SCOPED_TRACE(all[i].name);
    const Fit f = fit(emitted(all[i], broken, 99 + i), all[i].p, kDraws);
    EXPECT_GT(f.chi2, f.critical);
    EXPECT_GT(f.tv, 4 * kMaxTv);
  }
}

// With a point-mass q = delta_x (an n-gram draft, a greedy draft), speculative sampling keeps
// x with probability p(x) and otherwise draws from p without x, which is exactly what the exact
// rule does (draw y from p, keep x iff y == x): the joint distribution of (kept?, token) is
// the same. Compared by two-sample chi-square and total variation on 200k draws of each.
TEST(SpeculativeSampling, PointMassDraftsMatchTheExactRule) {
  const TokenDistribution p = {{0, 0.45}, {1, 0.25}, {2, 0.2}, {3, 0.1}};
  for (TokenId x : {0, 3, 5}) {
    SCOPED_TRACE("draft " + std::to_string(x));
    const TokenDistribution q = {{x, 1.0}};
    std::mt19937_64 rng_a(11 + static_cast<uint64_t>(x)), rng_b(101 + static_cast<uint64_t>(x));
    std::map<std::pair<bool, TokenId>, double> a, b;
    for (size_t i = 0; i < kDraws; ++i) {
      const SpeculativeOutcome o = speculative_accept(p, q, x, rng_a);
      a[{o.accepted, o.token}] += 1;
      const TokenId y = draw_token(p, rng_b);
      b[{y == x, y}] += 1;
    }
    std::set<std::pair<bool, TokenId>> keys;
    for (const auto& [key, count] : a) keys.insert(key);
    for (const auto& [key, count] : b) keys.insert(key);
    double chi2 = 0, tv = 0;
    for (const auto& key : keys) {
      const double ca = a.count(key) ? a.at(key) : 0.0, cb = b.count(key) ? b.at(key) : 0.0;
      chi2 += (ca - cb) * (ca - cb) / (ca + cb);
      tv += 0.5 * std::fabs(ca - cb) / static_cast<double>(kDraws);
    }
    const size_t cells = keys.size();
    EXPECT_LT(chi2, chi2_critical(cells > 1 ? cells - 1 : 1));
    EXPECT_LT(tv, kMaxTv);
    const double kept = a.count({true, x}) ? a.at({true, x}) / static_cast<double>(kDraws) : 0.0;
    EXPECT_NEAR(kept, probability_of(p, x), 0.005);
  }
}

TEST(SpeculativeSampling, DeterministicCases) {
  std::mt19937_64 rng(5);
  // p(x) >= q(x): always kept. p(x) = 0: never kept, and the residual is p.
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(speculative_accept({{1, 0.7}, {2, 0.3}}, {{1, 0.5}, {2, 0.5}}, 1, rng).accepted);
    const auto o = speculative_accept({{1, 1.0}}, {{1, 0.5}, {2, 0.5}}, 2, rng);
    EXPECT_FALSE(o.accepted);
    EXPECT_EQ(o.token, 1);
  }
  // Greedy (point-mass p): the draft is kept iff it is the argmax, else the argmax comes out.
  EXPECT_TRUE(speculative_accept({{4, 1.0}}, {{4, 1.0}}, 4, rng).accepted);
  EXPECT_EQ(speculative_accept({{4, 1.0}}, {{3, 1.0}}, 3, rng).token, 4);
}

TEST(SpeculativeSampling, RejectsADraftOutsideItsDistribution) {
  std::mt19937_64 rng(1);
  EXPECT_THROW(speculative_accept({{1, 1.0}}, {{2, 1.0}}, 1, rng), Error);
  EXPECT_THROW(speculative_accept({}, {{1, 1.0}}, 1, rng), Error);
  EXPECT_THROW(draw_token({}, rng), Error);
}

}  // namespace
}  // namespace kestrel::runtime
