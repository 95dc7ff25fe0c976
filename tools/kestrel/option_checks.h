// Checks of numeric command-line options that name what is wrong with the value: text that is no
// number at all ("Value abc is not an integer") apart from a number out of range. CLI::Range
// alone reports every value it cannot convert as "not in range".
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <type_traits>

#include <CLI/CLI.hpp>

namespace kestrel::tools {

/// True when `text` is an integer as CLI11 reads one (decimal, 0x hex, 0 octal, a sign), also one
/// too large for 64 bits (that is a range error, not a type error).
inline bool is_integer_text(const std::string& text) {
  char* end = nullptr;
  std::strtoll(text.c_str(), &end, 0);
  return end != text.c_str() && *end == '\0';
}

/// True when the integer `text` is past what T's 64-bit conversion holds (CLI11 would read
/// 18446744073709551615 as the largest value instead: a fresh-user check's --seed).
template <typename T>
bool overflows_64_bits(const std::string& text) {
  errno = 0;
  if constexpr (std::is_signed_v<T>) {
    (void)std::strtoll(text.c_str(), nullptr, 0);
  } else {
    (void)std::strtoull(text.c_str(), nullptr, 0);
  }
  return errno == ERANGE;
}

/// The check of an integer option: "Value abc is not an integer", else CLI::Range's
/// "Value 300 not in range 1 to 256" (also for a value past 64 bits).
template <typename T>
CLI::Validator integer_range(T lo, T hi) {
  static_assert(std::is_integral_v<T>, "integer_range is for integer options");
  const CLI::Range range(lo, hi);
  return CLI::Validator(
      [range, lo, hi](std::string& text) -> std::string {
        if (!is_integer_text(text)) return "Value " + text + " is not an integer";
        if (overflows_64_bits<T>(text)) {
          return "Value " + text + " not in range " + std::to_string(lo) + " to " + std::to_string(hi);
        }
        return range(text);
      },
      range.get_description());
}

/// The check of a floating-point option: "Value abc is not a number", "must be a finite number,
/// got nan" (CLI::Range lets NaN through), else "Value 3 not in range 0 to 2".
inline CLI::Validator number_range(double lo, double hi) {
  const CLI::Range range(lo, hi);
  return CLI::Validator(
      [range](std::string& text) {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0') return "Value " + text + " is not a number";
        if (!std::isfinite(v)) return "must be a finite number, got " + text;
        return range(text);
      },
      range.get_description());
}

/// The check of --draft: none, ngram, auto, default (the default model, resolved by
/// draft_model_argument), or a model file (a draft model image or GGUF).
inline CLI::Validator draft_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text == "none" || text == "ngram" || text == "auto" || text == "default") return "";
        std::error_code ec;
        if (!text.empty() && std::filesystem::is_regular_file(text, ec)) return "";
        return "'" + text + "' is neither none, ngram, auto, default (the default model) nor a model file (a draft "
               "model image or GGUF)";
      },
      "none|ngram|auto|default|IMAGE");
}

}  // namespace kestrel::tools
