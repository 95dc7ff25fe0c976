#include "kestrel/runtime/bench/prompts.h"

#include <limits>

#include "kestrel/base/error.h"
#include "kestrel/runtime/calibration.h"

namespace kestrel::runtime::bench {

std::vector<std::vector<TokenId>> cut_prompts(std::span<const TokenId> stream, std::optional<TokenId> bos,
                                              size_t n, size_t count) {
  const size_t lead = bos ? 1 : 0;
  if (n <= lead) throw Error("a prompt needs at least " + std::to_string(lead + 1) + " tokens");
  const size_t body = n - lead;
  if (count > stream.size() / body) {
    throw Error("the benchmark text has " + std::to_string(stream.size()) + " tokens: not enough for " +
                std::to_string(count) + " distinct prompts of " + std::to_string(n) + " tokens");
  }
  std::vector<std::vector<TokenId>> prompts(count);
  for (size_t k = 0; k < count; ++k) {
    std::vector<TokenId>& p = prompts[k];
    p.reserve(n);
    if (bos) p.push_back(*bos);
    const auto from = stream.begin() + static_cast<std::ptrdiff_t>(k * body);
    p.insert(p.end(), from, from + static_cast<std::ptrdiff_t>(body));
  }
  return prompts;
}

std::vector<TokenId> text_token_stream(const text::Tokenizer& tokenizer, const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error("cannot read the benchmark text " + path.string() + ": not a regular file");
  }
  const std::string text = calibration_text(path, std::numeric_limits<size_t>::max());
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw Error("the benchmark text " + path.string() + " has no text (it is empty or only whitespace)");
  }
  return tokenizer.encode(text, /*add_special=*/false, /*parse_special=*/false);
}

std::vector<std::vector<TokenId>> suite_prompts(const SuiteSpec& spec, std::span<const TokenId> stream,
                                                const text::Tokenizer& tokenizer) {
  std::optional<TokenId> bos;
  if (tokenizer.add_bos()) bos = tokenizer.bos();
  return cut_prompts(stream, bos, spec.prompt_tokens, spec.prompts_needed());
}

}  // namespace kestrel::runtime::bench
