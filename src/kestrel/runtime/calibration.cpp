#include "kestrel/runtime/calibration.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kestrel/base/error.h"

namespace kestrel::runtime {
namespace {

class SquareMeans : public model::ActivationObserver {
 public:
  void observe(const std::string& matrix, const float* x, size_t n_tokens, size_t cols) override {
    auto& [sum, count] = stats_[matrix];
    sum.resize(cols, 0.0);
    for (size_t t = 0; t < n_tokens; ++t) {
      for (size_t i = 0; i < cols; ++i) sum[i] += static_cast<double>(x[t * cols + i]) * x[t * cols + i];
    }
    count += n_tokens;
  }
  Importance means() const {
    Importance out;
    for (const auto& [name, sc] : stats_) {
      auto& v = out[name];
      for (double s : sc.first) v.push_back(static_cast<float>(s / static_cast<double>(sc.second)));
    }
    return out;
  }

 private:
  std::map<std::string, std::pair<std::vector<double>, size_t>> stats_;
};

}  // namespace

Importance collect_importance(Engine& engine, const std::vector<TokenId>& tokens, size_t chunk) {
  if (tokens.size() < 2 || chunk < 2) throw Error("calibration needs at least 2 tokens");
  chunk = std::min(chunk, engine.model().info().context_length);
  SquareMeans observer;
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
  return observer.means();
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
