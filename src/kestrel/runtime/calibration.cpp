#include "kestrel/runtime/calibration.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kestrel/base/error.h"

namespace kestrel::runtime {
namespace {

// 64-bit FNV-1a: a per-matrix seed that does not depend on the standard library.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

class StatsObserver : public model::ActivationObserver {
 public:
  StatsObserver(size_t sample_rows, uint64_t seed) : sample_rows_(sample_rows), seed_(seed) {}

  void observe(const std::string& matrix, const float* x, size_t n_tokens, size_t cols) override {
    // The same buffer again (Q/K/V, gate/up): the same input, recorded once.
    if (x == last_x_ && n_tokens == last_n_ && cols == last_cols_ &&
        std::equal(first_row_.begin(), first_row_.end(), x)) {
      alias_[matrix] = last_record_;
      return;
    }
    auto [it, fresh] = records_.try_emplace(matrix);
    Record& r = it->second;
    if (fresh) {
      r.cols = cols;
      r.sum_sq.assign(cols, 0.0);
      r.sum_abs.assign(cols, 0.0);
      r.rng = seed_ ^ fnv1a(matrix);
    } else if (r.cols != cols) {
      throw Error("calibration: " + matrix + " was seen with " + std::to_string(r.cols) + " and " +
                  std::to_string(cols) + " inputs");
    }
    for (size_t t = 0; t < n_tokens; ++t) {
      const float* row = x + t * cols;
      for (size_t i = 0; i < cols; ++i) {
        r.sum_sq[i] += static_cast<double>(row[i]) * row[i];
        r.sum_abs[i] += std::fabs(static_cast<double>(row[i]));
      }
      sample(r, row);
      ++r.count;
    }
    last_x_ = x;
    last_n_ = n_tokens;
    last_cols_ = cols;
    first_row_.assign(x, x + cols);
    last_record_ = matrix;
  }

  quant::ActivationStatsMap stats() const {
    quant::ActivationStatsMap out;
    for (const auto& [name, r] : records_) {
      auto s = std::make_shared<quant::ActivationStats>();
      s->cols = r.cols;
      const double n = static_cast<double>(std::max<size_t>(r.count, 1));
      for (size_t i = 0; i < r.cols; ++i) {
        s->mean_square.push_back(static_cast<float>(r.sum_sq[i] / n));
        s->mean_abs.push_back(static_cast<float>(r.sum_abs[i] / n));
      }
      s->sample = r.sample;
      out[name] = std::move(s);
    }
    for (const auto& [name, first] : alias_) out[name] = out.at(first);
    return out;
  }

 private:
  struct Record {
    size_t cols = 0, count = 0;
    std::vector<double> sum_sq, sum_abs;
    std::vector<float> sample;  // [<= sample_rows, cols]
    uint64_t rng = 0;
  };

  // Reservoir sampling (Vitter's algorithm R) with a splitmix64 generator.
  void sample(Record& r, const float* row) const {
    if (sample_rows_ == 0) return;
    size_t slot = r.count;
    if (r.count >= sample_rows_) {
      uint64_t z = (r.rng += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      slot = static_cast<size_t>(z % (r.count + 1));
      if (slot >= sample_rows_) return;
    } else {
      r.sample.resize((r.count + 1) * r.cols);
    }
    std::copy(row, row + r.cols, r.sample.begin() + static_cast<std::ptrdiff_t>(slot * r.cols));
  }

  size_t sample_rows_;
  uint64_t seed_;
  std::map<std::string, Record> records_;
  std::map<std::string, std::string> alias_;
  const float* last_x_ = nullptr;
  size_t last_n_ = 0, last_cols_ = 0;
  std::vector<float> first_row_;
  std::string last_record_;
};

}  // namespace

quant::ActivationStatsMap collect_activation_stats(Engine& engine, const std::vector<TokenId>& tokens,
                                                   const CalibrationOptions& options) {
  if (tokens.size() < 2 || options.chunk < 2) throw Error("calibration needs at least 2 tokens");
  const size_t chunk = std::min(options.chunk, engine.model().info().context_length);
  StatsObserver observer(options.sample_rows, options.seed);
  model::KvCache cache = engine.model().new_cache(chunk);
  std::vector<float> logits(engine.model().info().n_vocab);
  const TokenId bos = engine.tokenizer().bos();
  for (size_t start = 0; start < tokens.size(); start += chunk - 1) {
    std::vector<TokenId> part = {bos};
    const size_t end = std::min(tokens.size(), start + chunk - 1);
    part.insert(part.end(), tokens.begin() + static_cast<std::ptrdiff_t>(start),
                tokens.begin() + static_cast<std::ptrdiff_t>(end));
    cache.clear();
    engine.model().forward(part, cache, model::Logits::kLast, logits.data(), engine.pool(), &observer);
  }
  return observer.stats();
}

std::string calibration_text(const std::filesystem::path& path, size_t max_chars) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read calibration file " + path.string());
  if (path.extension() != ".jsonl") {
    std::ostringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (text.size() > max_chars) text.resize(max_chars);
    return text;
  }
  std::string text, line;
  size_t line_no = 0;
  while (text.size() < max_chars && std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(path.string() + ":" + std::to_string(line_no) + ": not JSON: " + e.what());
    }
    if (row.value("deleted", false) || !row.contains("text") || !row["text"].is_string()) continue;
    if (!text.empty()) text += "\n\n";
    text += row["text"].get<std::string>();
  }
  if (text.empty()) throw Error(path.string() + ": no non-deleted rows with a \"text\" field");
  if (text.size() > max_chars) text.resize(max_chars);
  return text;
}

}  // namespace kestrel::runtime
