// POST routes read their body through post_limited: httplib 0.11 applies set_payload_max_length only to a
// body with a Content-Length and reads a chunked body whole, however large. Here the body is read piece by
// piece and refused with 413 (an OpenAI- or Ollama-style error, the connection closed) once it passes
// --max-request-bytes, whichever way it is sent.
#pragma once

#include <string>

#include "server/httplib_config.hpp"
#include "server/routes.hpp"

namespace deltaflow::server {

void post_limited(httplib::Server& svr, const ServerContext& ctx, bool ollama, const std::string& path,
                  httplib::Server::Handler handler);

}  // namespace deltaflow::server
