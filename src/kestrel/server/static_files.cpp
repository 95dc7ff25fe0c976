#include "kestrel/server/static_files.h"

namespace kestrel::server {

const StaticFile* find_static_file(std::string_view name) {
  for (const StaticFile& f : static_files()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string_view static_content_type(std::string_view name) {
  auto ends_with = [&](std::string_view ext) { return name.ends_with(ext); };
  if (ends_with(".html")) return "text/html; charset=utf-8";
  if (ends_with(".css")) return "text/css; charset=utf-8";
  if (ends_with(".js")) return "text/javascript; charset=utf-8";
  if (ends_with(".svg")) return "image/svg+xml";
  if (ends_with(".png")) return "image/png";
  if (ends_with(".txt") || ends_with(".md")) return "text/plain; charset=utf-8";
  return "application/octet-stream";
}

}  // namespace kestrel::server
