// The checkout's root, for tests that read committed data (tests/goldens, tests/data) or the
// shared data beside the checkout (../shared/data).
#pragma once

#include <filesystem>

namespace kestrel::testing {

/// The source tree the tests were configured from (CMake's CMAKE_SOURCE_DIR). Defined in one
/// translation unit (tests/source_dir.cpp), so that the checkout's path reaches no other test
/// file's compile command: a clone in another folder (CI's) then reuses their compiler cache.
const std::filesystem::path& source_dir();

}  // namespace kestrel::testing
