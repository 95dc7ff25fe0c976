#include "partial_file.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

namespace kestrel::tools {
namespace {

char g_partial_path[4096];

extern "C" void remove_partial_and_exit(int sig) {
  if (g_partial_path[0] != '\0') ::unlink(g_partial_path);
  ::_exit(128 + sig);
}

}  // namespace

void remove_partial_on_signal(const std::string& path) {
  const std::string partial = path + ".partial";
  if (partial.size() >= sizeof(g_partial_path)) return;
  std::memcpy(g_partial_path, partial.c_str(), partial.size() + 1);
  std::signal(SIGINT, remove_partial_and_exit);
  std::signal(SIGTERM, remove_partial_and_exit);
  std::signal(SIGHUP, remove_partial_and_exit);
  std::signal(SIGPIPE, remove_partial_and_exit);
}

}  // namespace kestrel::tools
