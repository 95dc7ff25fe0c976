// The chat page's static files (src/kestrel/server/webui/), compiled into the binary by
// cmake/embed_files.cmake: `kestrel serve` needs no files beside it and no network.
#pragma once

#include <span>
#include <string_view>

namespace kestrel::server {

struct StaticFile {
  std::string_view name;  // path relative to webui/, e.g. "app.js"
  std::string_view data;
};

/// Every embedded file (generated source).
std::span<const StaticFile> static_files();

/// The file called `name`, or null.
const StaticFile* find_static_file(std::string_view name);

/// The Content-Type for a file name's extension (with charset for text types).
std::string_view static_content_type(std::string_view name);

}  // namespace kestrel::server
