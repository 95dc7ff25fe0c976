// The memory check of --parallel: MemAvailable from /proc/meminfo, and the message that names
// what is needed, what is available and what to lower.
#include <gtest/gtest.h>

#include <string>

#include "kestrel/base/error.h"
#include "kestrel/model/model.h"
#include "kestrel/runtime/session_pool.h"

using kestrel::model::format_bytes;
using kestrel::model::mem_available_bytes;
using kestrel::runtime::check_parallel_memory;

namespace {

constexpr size_t kGiB = size_t{1} << 30;

// The message of check_parallel_memory, or "" when it passes.
std::string parallel_error(size_t n_sessions, size_t per_session, size_t available) {
  try {
    check_parallel_memory(n_sessions, per_session, 32768, available);
  } catch (const kestrel::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(MemoryCheck, MemAvailableFromMeminfo) {
  const char* meminfo =
      "MemTotal:       24683492 kB\nMemFree:        21208540 kB\nMemAvailable:   24064940 kB\nBuffers: 1 kB\n";
  EXPECT_EQ(mem_available_bytes(meminfo), size_t{24064940} * 1024);
  EXPECT_EQ(mem_available_bytes("MemTotal: 5 kB\nMemAvailable: 7 kB"), size_t{7} * 1024);  // no final newline
  EXPECT_FALSE(mem_available_bytes("MemTotal: 5 kB\nMemFree: 3 kB\n").has_value());  // kernels before 3.14
  EXPECT_FALSE(mem_available_bytes("MemAvailable: kB\n").has_value());
  EXPECT_FALSE(mem_available_bytes("").has_value());
  EXPECT_GT(kestrel::model::available_memory(), size_t{0});
}

TEST(MemoryCheck, ParallelAgainstAvailableMemory) {
  // The engine's own session exists already: --parallel 4 allocates 3 more.
  EXPECT_EQ(parallel_error(4, kGiB, 3 * kGiB), "");
  EXPECT_EQ(parallel_error(1, 100 * kGiB, 0), "");
  const std::string e = parallel_error(8, kGiB, 3 * kGiB + kGiB / 2);
  EXPECT_NE(e.find("--parallel 8 needs 7 more sessions of 1.0 GiB each"), std::string::npos) << e;
  EXPECT_NE(e.find("32768 positions"), std::string::npos) << e;
  EXPECT_NE(e.find("7.0 GiB, but only 3.5 GiB of memory is available"), std::string::npos) << e;
  EXPECT_NE(e.find("lower --parallel to at most 4, or --ctx"), std::string::npos) << e;
  const std::string none = parallel_error(2, 2 * kGiB, kGiB);
  EXPECT_NE(none.find("lower --parallel to 1, or --ctx"), std::string::npos) << none;
}

TEST(MemoryCheck, FormatBytes) {
  EXPECT_EQ(format_bytes(3 * kGiB / 2), "1.5 GiB");
  EXPECT_EQ(format_bytes(size_t{300} << 20), "300 MiB");
}
