#include "kestrel/runtime/bench/memory.h"

#include <fstream>
#include <sstream>

namespace kestrel::runtime::bench {

std::optional<size_t> parse_status_kib(const std::string& status_text, const std::string& key) {
  std::istringstream in(status_text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0 || line.size() <= key.size() || line[key.size()] != ':') continue;
    std::istringstream fields(line.substr(key.size() + 1));
    size_t value = 0;
    std::string unit;
    if (!(fields >> value >> unit) || unit != "kB") return std::nullopt;
    return value * 1024;
  }
  return std::nullopt;
}

RssReading read_rss(const std::filesystem::path& status) {
  std::ifstream in(status);
  if (!in) return {};
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  return {parse_status_kib(text, "VmRSS"), parse_status_kib(text, "VmHWM")};
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace kestrel::runtime::bench
