#include "kestrel/kernels/kernel_options.h"

#include <cstdlib>
#include <cstring>

#include "kestrel/base/error.h"

namespace kestrel::kernels {
namespace {

// A name of LIST and what it does to the switches.
struct Switch {
  const char* name;
  void (*apply)(KernelOptions&);
  bool (*is_set)(const KernelOptions&);  // differs from the default in this switch's way
};

constexpr Switch kSwitches[] = {
    {"int8", [](KernelOptions& o) { o.activations = DecodeActivations::kInt8; },
     [](const KernelOptions& o) { return o.activations == DecodeActivations::kInt8; }},
    {"bf16", [](KernelOptions& o) { o.activations = DecodeActivations::kBf16; },
     [](const KernelOptions& o) { return o.activations == DecodeActivations::kBf16; }},
    {"no-avx2", [](KernelOptions& o) { o.avx2 = false; }, [](const KernelOptions& o) { return !o.avx2; }},
    {"no-vnni", [](KernelOptions& o) { o.avx512_vnni = false; }, [](const KernelOptions& o) { return !o.avx512_vnni; }},
    {"no-bf16-dot", [](KernelOptions& o) { o.bf16_dot = false; }, [](const KernelOptions& o) { return !o.bf16_dot; }},
    {"no-bf16-attention", [](KernelOptions& o) { o.bf16_attention = false; },
     [](const KernelOptions& o) { return !o.bf16_attention; }},
    {"no-interleave", [](KernelOptions& o) { o.interleave = false; }, [](const KernelOptions& o) { return !o.interleave; }},
    {"amx", [](KernelOptions& o) { o.amx = true; }, [](const KernelOptions& o) { return o.amx; }},
    {"w8a8", [](KernelOptions& o) { o.w8a8 = true; }, [](const KernelOptions& o) { return o.w8a8; }},
};

std::string known_names() {
  std::string s;
  for (const Switch& sw : kSwitches) s += std::string(s.empty() ? "" : ", ") + sw.name;
  return s + ", default";
}

bool blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

// A name as an error message shows it: at most 40 characters.
std::string shown(std::string_view name) {
  return name.size() <= 40 ? std::string(name) : std::string(name.substr(0, 40)) + "...";
}

// Earlier releases' variables, as the names above.
const char* env(const char* variable) {
  const char* v = std::getenv(variable);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// A variable that is 0 or 1; anything else is refused with `meaning` (what 0 and 1 do).
bool zero_or_one(const char* variable, const char* v, const char* meaning) {
  if (std::strcmp(v, "0") == 0) return false;
  if (std::strcmp(v, "1") == 0) return true;
  throw Error(std::string(variable) + " must be " + meaning + ", not '" + v + "' (or use KESTREL_KERNELS)");
}

KernelOptions from_environment() {
  KernelOptions o;
  if (const char* v = env("KESTREL_W4_INT8")) {
    o.activations = zero_or_one("KESTREL_W4_INT8", v, "0 (bf16 activations) or 1 (int8)") ? DecodeActivations::kInt8
                                                                                          : DecodeActivations::kBf16;
  }
  if (const char* v = env("KESTREL_AMX")) o.amx = zero_or_one("KESTREL_AMX", v, "0 or 1");
  if (const char* v = env("KESTREL_W8A8")) {
    o.w8a8 = zero_or_one("KESTREL_W8A8", v, "0 (prefill from the INT4 copy) or 1 (an int8 copy)");
  }
  // The switches-off variables: set to anything but "0" turns the kernel off ("00" too).
  const auto off = [](const char* variable) {
    const char* v = env(variable);
    return v != nullptr && std::strcmp(v, "0") != 0;
  };
  if (off("KESTREL_NO_AVX2")) o.avx2 = false;
  if (off("KESTREL_NO_VNNI")) o.avx512_vnni = false;
  if (off("KESTREL_NO_BF16_DOT")) o.bf16_dot = false;
  if (off("KESTREL_NO_BF16_ATTENTION")) o.bf16_attention = false;
  if (off("KESTREL_NO_INTERLEAVE")) o.interleave = false;
  if (const char* v = env("KESTREL_KERNELS")) o = parse_kernel_options(v, "KESTREL_KERNELS", o);
  return o;
}

KernelOptions& current() {
  static KernelOptions options = from_environment();  // a throw leaves it to the next call
  return options;
}

}  // namespace

KernelOptions parse_kernel_options(std::string_view list, std::string_view source, const KernelOptions& base) {
  KernelOptions o = base;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view name = trimmed(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (name.empty() || name == "default") continue;
    const Switch* found = nullptr;
    for (const Switch& sw : kSwitches) {
      if (name == sw.name) found = &sw;
    }
    if (found == nullptr) {
      throw Error(std::string(source) + ": unknown kernel switch '" + shown(name) + "' (known: " +
                  known_names() + "; docs/kernels.md)");
    }
    found->apply(o);
  }
  return o;
}

std::string kernel_options_name(const KernelOptions& o) {
  std::string s;
  for (const Switch& sw : kSwitches) {
    if (sw.is_set(o)) s += std::string(s.empty() ? "" : ",") + sw.name;
  }
  return s.empty() ? "default" : s;
}

const KernelOptions& kernel_options() { return current(); }

void set_kernel_options(const KernelOptions& o) { current() = o; }

}  // namespace kestrel::kernels
