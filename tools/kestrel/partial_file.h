// A file written as PATH.partial and renamed when complete: what a killed command leaves behind.
#pragma once

#include <string>

namespace kestrel::tools {

/// From now on, SIGINT / SIGTERM / SIGHUP / SIGPIPE (stdout or stderr piped into a reader that
/// quit, e.g. `| head -1`) remove `path` + ".partial" (unlink is async-signal-safe) and exit with
/// 128 + the signal, so a killed `build` or `export` leaves no half-written file. One path per
/// process (the last call's).
void remove_partial_on_signal(const std::string& path);

}  // namespace kestrel::tools
