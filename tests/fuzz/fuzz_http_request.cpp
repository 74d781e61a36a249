// The bytes a client sends on a connection: any of them must parse into requests or one clear failure
// without a crash, with the server's limits holding (no head or body past them gets through), and each
// request must route and its response head serialize. Paths run through the router with the server's route
// shapes (exact and prefix), which is where a 30 KB path once overflowed std::regex's recursion.
#include <cstddef>
#include <cstdint>
#include <string>

#include "http/request_parse.hpp"
#include "http/router.hpp"

using namespace deltaflow::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Router router = [] {
    Router r;
    for (const char* p : {"/health", "/v1/chat/completions", "/v1/models", "/v1/models/*", "/web/*", "/"})
      r.add("GET", p, [](const Request&, Response&) {});
    r.add("POST", "/v1/completions", [](const Request&, Response&) {});
    return r;
  }();
  ParseLimits limits;
  limits.max_header_bytes = 4096;
  limits.max_body_bytes = 8192;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  ParsedBytes parsed = parse_requests(bytes, limits);
  for (Request& req : parsed.requests) {
    if (req.body.size() > limits.max_body_bytes) __builtin_trap();
    if (req.target.size() > limits.max_header_bytes) __builtin_trap();
    if (req.path.size() > req.target.size()) __builtin_trap();  // decoding only shortens
    const Router::Found f = router.find(req);
    if (f.outcome == Router::Outcome::kFound && (req.matches.empty() || req.matches[0] != req.path))
      __builtin_trap();
    Response res;
    res.status = f.outcome == Router::Outcome::kFound ? 200 : 404;
    res.set_header("X-Path", std::string(find_header(req.headers, "Host")));
    const std::string head = serialize_head(res, req.version, true, req.body.size(), false);
    if (head.size() < 4 || head.compare(head.size() - 4, 4, "\r\n\r\n") != 0) __builtin_trap();
  }
  const int s = parsed.failure.status;
  if (s != 0 && s != 400 && s != 413 && s != 431) __builtin_trap();
  if (s != 0 && parsed.failure.message.empty()) __builtin_trap();
  return 0;
}
