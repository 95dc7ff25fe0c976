#include "kestrel/text/bpe.h"

#include <array>
#include <queue>

#include "kestrel/base/error.h"

namespace kestrel::text {
namespace {

size_t utf8_len(char lead) {
  static constexpr std::array<uint8_t, 16> kLen = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[static_cast<uint8_t>(lead) >> 4];
}

struct Symbol {
  int prev;
  int next;
  size_t offset;
  size_t n;  // 0 once merged into its left neighbour
};

struct Candidate {
  int32_t rank;
  int left;
  int right;
  size_t size;  // bytes of the merged piece, to detect a stale entry
};

/// Lowest rank first, then the leftmost pair.
struct CandidateAfter {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

BpeMerges::BpeMerges(const std::vector<std::string>& merges) {
  ranks_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos || space + 1 >= m.size()) {
      throw Error("tokenizer: merge " + std::to_string(r) + " ('" + m + "') is not two pieces separated by a space");
    }
    ranks_.emplace(m, static_cast<int32_t>(r));  // the first occurrence of a pair keeps its rank
  }
}

int32_t BpeMerges::rank(std::string_view a, std::string_view b) const {
  std::string key;
  key.reserve(a.size() + b.size() + 1);
  key.append(a).push_back(' ');
  key.append(b);
  const auto it = ranks_.find(key);
  return it == ranks_.end() ? -1 : it->second;
}

void BpeMerges::encode(std::string_view word,
                       const std::function<std::optional<int32_t>(std::string_view)>& find,
                       const std::function<int32_t(uint8_t)>& byte_token,
                       std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t offset = 0; offset < word.size();) {
    const size_t n = std::min(utf8_len(word[offset]), word.size() - offset);
    const int index = static_cast<int>(symbols.size());
    offset += n;
    symbols.push_back({index - 1, offset == word.size() ? -1 : index + 1, offset - n, n});
  }
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateAfter> queue;
  auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const int32_t k = rank(word.substr(l.offset, l.n), word.substr(r.offset, r.n));
    if (k >= 0) queue.push({k, left, right, l.n + r.n});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) consider(i - 1, i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    if (left.n == 0 || right.n == 0 || left.next != top.right || left.n + right.n != top.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    consider(left.prev, top.left);
    consider(top.left, left.next);
  }
  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = word.substr(symbols[i].offset, symbols[i].n);
    if (const auto id = find(piece)) {
      out.push_back(*id);
      continue;
    }
    for (const char c : piece) out.push_back(byte_token(static_cast<uint8_t>(c)));
  }
}

std::vector<std::string_view> split_newline_runs(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start < text.size()) {
    const bool newline = text[start] == '\n';
    size_t end = start + 1;
    while (end < text.size() && (text[end] == '\n') == newline) ++end;
    parts.push_back(text.substr(start, end - start));
    start = end;
  }
  return parts;
}

}  // namespace kestrel::text
