// Resident memory of this process, from /proc/self/status.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>

namespace kestrel::runtime::bench {

/// VmRSS and VmHWM (peak) of /proc/self/status in bytes; nullopt where unreadable.
struct RssReading {
  std::optional<size_t> rss_bytes;
  std::optional<size_t> peak_bytes;
};
RssReading read_rss(const std::filesystem::path& status = "/proc/self/status");

/// Parses a /proc/<pid>/status text: the value of `key` ("VmRSS", "VmHWM") in bytes.
std::optional<size_t> parse_status_kib(const std::string& status_text, const std::string& key);

/// Resets the peak (VmHWM) to the current RSS by writing "5" to /proc/self/clear_refs (Linux
/// 4.0+). Returns false when the kernel refuses it; the peak then counts from process start.
bool reset_peak_rss();

}  // namespace kestrel::runtime::bench
