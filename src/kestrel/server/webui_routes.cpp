// The chat page and the live metrics page: static files embedded in the binary, served
// without authentication (they hold no data; the page sends the API key with its API calls).
#include <string>

#include "kestrel/server/app.h"
#include "kestrel/server/static_files.h"

namespace kestrel::server {
namespace {

// The pages load only their own files and talk only to this server; nothing inline runs.
constexpr const char* kContentSecurityPolicy =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

void send_static(std::string_view name, httplib::Response& res) {
  const StaticFile* file = find_static_file(name);
  if (file == nullptr) {
    res.status = 404;  // the error handler writes the body
    return;
  }
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("Content-Security-Policy", kContentSecurityPolicy);
  res.set_content(std::string(file->data), std::string(static_content_type(name)));
}

}  // namespace

void App::install_webui_routes() {
  http_.Get("/", [](const httplib::Request&, httplib::Response& res) { send_static("index.html", res); });
  http_.Get("/metrics/live", [](const httplib::Request&, httplib::Response& res) { send_static("live.html", res); });
  http_.Get(R"(/ui/([A-Za-z0-9_.-]+))", [](const httplib::Request& req, httplib::Response& res) {
    send_static(req.matches[1].str(), res);
  });
}

}  // namespace kestrel::server
