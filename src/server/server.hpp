// `deltaflow serve`: the OpenAI- and Ollama-compatible HTTP server (src/http: event-driven connections,
// handler threads). Handler threads parse, render the chat template, tokenize and detokenize; one engine
// thread runs the model (DESIGN.md §5).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "engine/generate.hpp"
#include "http/server.hpp"
#include "server/image_options.hpp"

namespace deltaflow::server {

struct ServeOptions {
  std::string model_dir;
  engine::Device device = engine::Device::kAuto;
  int tensor_parallel = 1;  // GPUs the model is split over
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;            // empty: no key (loopback only, unless insecure_no_auth)
  bool insecure_no_auth = false;  // allow a non-loopback host without a key
  std::string served_model_name;  // empty: the model directory's name
  // The engine: --max-model-len, --max-queue (more waiting requests get 429), --max-num-seqs, ...
  engine::SchedulerOptions engine;
  std::optional<bool> default_enable_thinking;  // none: from the model directory (request_defaults.hpp)
  int64_t default_max_tokens = 0;               // 0: from the model and the backend (request_defaults.hpp)
  bool enable_test_hooks = false;               // accept "deltaflow_forced_tokens" (tests only)
  // Connections and requests (http/server.hpp): --max-request-bytes (413), --max-connections (503),
  // --header-timeout / --body-timeout (408), --keep-alive-timeout.
  http::ServerOptions http;
  bool log_requests = true;                  // one line per request on stderr
  std::vector<std::string> allowed_origins;  // CORS (cors.hpp); empty: no cross-origin browser access
  bool allow_special_in_content = false;     // special tokens in message contents are parsed, not text
  // On SIGINT/SIGTERM: stop accepting, let running requests finish for this long, then abort the rest
  // (their streams end with finish_reason "abort" and [DONE]) and exit 0.
  double shutdown_timeout_s = 30;
  int64_t max_tokens_limit = 0;  // --max-tokens-limit: a request asking more tokens gets 400; 0: no limit
  ImageOptions images;           // --allowed-local-media-path, --max-image-pixels, --limit-mm-per-prompt
};

// Checks the options (a non-loopback host needs a key unless insecure_no_auth), binds, loads the model
// (/health answers 503 meanwhile), and serves until SIGINT or SIGTERM, then drains (shutdown_timeout_s).
core::Status serve(const ServeOptions& options);

}  // namespace deltaflow::server
