// Cross-origin requests from browsers (CORS). `--allowed-origins` lists the origins whose pages may call the
// API ("https://app.example.com,http://localhost:5173", or "*"); the default is none. The server's own chat
// page (GET /) is same-origin and needs no entry.
//
// - A preflight (OPTIONS with an Origin) from an allowed origin gets 204 with Access-Control-Allow-Origin,
//   -Methods, -Headers (what the browser asked for) and -Max-Age, before authentication (browsers send no
//   Authorization on a preflight); from any other origin, 403.
// - Other requests from an allowed origin get Access-Control-Allow-Origin (and Vary: Origin) on every
//   response, errors included, so the page can read them. A request from a cross origin that is not allowed
//   is refused with 403 before anything runs: a page elsewhere cannot make this server generate (a "simple"
//   POST needs no preflight).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace deltaflow::server {

// "a,b,c" -> origins, each "*" or scheme://host[:port] (no path); errors name the bad entry.
core::Expected<std::vector<std::string>> parse_allowed_origins(const std::string& list);

enum class OriginCheck { kNone, kSameOrigin, kAllowed, kRefused };

// `origin`: the request's Origin header (empty when absent); `host`: its Host header.
OriginCheck check_origin(const std::vector<std::string>& allowed, const std::string& origin,
                         const std::string& host);

}  // namespace deltaflow::server
