// The chat page: GET / and GET /web/<file>, served from the files compiled into the binary (web_assets.hpp).
// They need no API key (a browser cannot send one when it opens a page, and they hold nothing secret); the
// page asks for the key when the server wants one and sends it with its API calls.
#include <cstring>

#include "server/routes.hpp"
#include "server/web_assets.hpp"

namespace deltaflow::server {

namespace {

const char* content_type(const std::string& name) {
  auto ends = [&](const char* ext) { return name.size() >= std::strlen(ext) && name.ends_with(ext); };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

const EmbeddedAsset* find_asset(const std::string& name) {
  for (const auto& a : web_assets())
    if (name == a.name) return &a;
  return nullptr;
}

void send_asset(http::Response& res, const EmbeddedAsset& a) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Content-Security-Policy",
                 "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                 "connect-src 'self'; frame-ancestors 'none'");
  res.set_content(std::string(a.text), content_type(a.name));
}

}  // namespace

bool is_web_path(const std::string& path) {
  return path == "/" || path.rfind("/web/", 0) == 0;
}

void add_web_routes(http::Server& svr) {
  svr.route("GET", "/", [](const http::Request&, http::Response& res) {
    if (const EmbeddedAsset* a = find_asset("index.html")) return send_asset(res, *a);
    send_error(res, not_found("this build has no chat page"), false);
  });
  svr.route("GET", "/web/*", [](const http::Request& req, http::Response& res) {
    const std::string name = req.matches[1];
    if (const EmbeddedAsset* a = find_asset(name)) return send_asset(res, *a);
    send_error(res, not_found("no file /web/" + name), false);
  });
}

}  // namespace deltaflow::server
