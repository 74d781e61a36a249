// `deltaflow serve`: the HTTP server (src/server/).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/model_options.hpp"
#include "server/cors.hpp"
#include "server/server.hpp"

namespace deltaflow::cli {

namespace {

core::Expected<bool> parse_bool(const std::string& flag, const std::string& v) {
  if (v == "true" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "no") return false;
  return core::Error{"flag " + flag + ": '" + v + "' is not true or false"};
}

}  // namespace

int cmd_serve(const Argv& argv) {
  const std::string cmd = "serve";
  ArgSpec spec{{"--model",
                "--device",
                "--host",
                "--port",
                "--api-key",
                "--api-key-file",
                "--served-model-name",
                "--default-enable-thinking",
                "--max-body-bytes",
                "--tensor-parallel-size",
                "--default-max-tokens",
                "--allowed-origins",
                "--shutdown-timeout",
                "--max-tokens-limit",
                "--max-request-bytes",
                "--allowed-local-media-path",
                "--max-image-pixels",
                "--limit-mm-per-prompt",
                "--max-connections",
                "--header-timeout",
                "--body-timeout",
                "--keep-alive-timeout"},
               {"--insecure-no-auth", "--enable-test-hooks", "--quiet", "--allow-special-in-content"},
               0};
  add_engine_flags(spec);
  auto args = Args::parse(argv, spec);
  if (!args) return fail(cmd, args.message());
  server::ServeOptions o;
  o.model_dir = model_dir(*args);
  auto device = parse_device(*args);
  if (!device) return fail(cmd, device.message());
  o.device = *device;
  auto tp = parse_tensor_parallel(*args, o.device);
  if (!tp) return fail(cmd, tp.message());
  o.tensor_parallel = *tp;
  o.host = args->get_or("--host", "127.0.0.1");
  auto port = args->get_int("--port", 8000);
  if (!port) return fail(cmd, port.message());
  if (*port < 0 || *port > 65535) return fail(cmd, "flag --port must be in [0, 65535] (0: any free port)");
  o.port = static_cast<int>(*port);
  if (args->has("--api-key") && args->has("--api-key-file"))
    return fail(cmd, "give --api-key or --api-key-file, not both");
  if (auto k = args->get("--api-key")) o.api_key = *k;
  if (auto f = args->get("--api-key-file")) {
    std::ifstream in(*f);
    if (!in) return fail(cmd, "flag --api-key-file: cannot open '" + *f + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string key = ss.str();
    while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ')) key.pop_back();
    if (key.empty()) return fail(cmd, "flag --api-key-file: '" + *f + "' is empty");
    o.api_key = key;
  }
  o.served_model_name = args->get_or("--served-model-name", "");
  auto engine = parse_engine_options(*args);
  if (!engine) return fail(cmd, engine.message());
  o.engine = *engine;
  // --max-request-bytes; --max-body-bytes is its older name.
  if (args->has("--max-request-bytes") && args->has("--max-body-bytes"))
    return fail(cmd, "give --max-request-bytes or --max-body-bytes (its older name), not both");
  const char* body_flag = args->has("--max-body-bytes") ? "--max-body-bytes" : "--max-request-bytes";
  auto body = args->get_int(body_flag, static_cast<int64_t>(o.http.max_body_bytes));
  if (!body) return fail(cmd, body.message());
  if (*body < 1024 || *body > (int64_t{1} << 32))
    return fail(cmd, std::string("flag ") + body_flag + " must be in [1024, 4294967296]");
  o.http.max_body_bytes = static_cast<size_t>(*body);
  if (auto t = args->get("--default-enable-thinking")) {
    auto b = parse_bool("--default-enable-thinking", *t);
    if (!b) return fail(cmd, b.message());
    o.default_enable_thinking = *b;
  }
  auto max_tokens = args->get_int("--default-max-tokens", 0);
  if (!max_tokens) return fail(cmd, max_tokens.message());
  if (*max_tokens < 0 || *max_tokens > (1 << 30))
    return fail(cmd, "flag --default-max-tokens must be in [1, 1073741824] (0: the model's default)");
  o.default_max_tokens = *max_tokens;
  auto limit = args->get_int("--max-tokens-limit", 0);
  if (!limit) return fail(cmd, limit.message());
  if (*limit < 0 || *limit > (1 << 30))
    return fail(cmd, "flag --max-tokens-limit must be in [1, 1073741824] (0: no limit)");
  o.max_tokens_limit = *limit;
  o.images.allowed_local_media_path = args->get_or("--allowed-local-media-path", "");
  auto max_pixels = args->get_int("--max-image-pixels", 0);
  if (!max_pixels) return fail(cmd, max_pixels.message());
  if (*max_pixels < 0)
    return fail(cmd, "flag --max-image-pixels must be at least 1 (0: the decoder's limit)");
  o.images.max_image_pixels = *max_pixels;
  auto mm = args->get_int("--limit-mm-per-prompt", 16);
  if (!mm) return fail(cmd, mm.message());
  if (*mm < 0 || *mm > 256) return fail(cmd, "flag --limit-mm-per-prompt must be in [0, 256]");
  o.images.limit_per_prompt = *mm;
  if (auto origins = args->get("--allowed-origins")) {
    auto list = server::parse_allowed_origins(*origins);
    if (!list) return fail(cmd, "flag --allowed-origins: " + list.message());
    o.allowed_origins = std::move(*list);
  }
  auto conns = args->get_int("--max-connections", static_cast<int64_t>(o.http.max_connections));
  if (!conns) return fail(cmd, conns.message());
  if (*conns < 1 || *conns > 65536) return fail(cmd, "flag --max-connections must be in [1, 65536]");
  o.http.max_connections = static_cast<size_t>(*conns);
  struct Timeout {
    const char* flag;
    double* value;
  };
  for (const Timeout& t : {Timeout{"--header-timeout", &o.http.header_timeout_s},
                           Timeout{"--body-timeout", &o.http.body_timeout_s},
                           Timeout{"--keep-alive-timeout", &o.http.keep_alive_timeout_s}}) {
    auto v = args->get_double(t.flag, *t.value);
    if (!v) return fail(cmd, v.message());
    if (!(*v >= 0.1 && *v <= 3600))
      return fail(cmd, std::string("flag ") + t.flag + " must be in [0.1, 3600] seconds");
    *t.value = *v;
  }
  auto shutdown = args->get_double("--shutdown-timeout", 30.0);
  if (!shutdown) return fail(cmd, shutdown.message());
  if (!(*shutdown >= 0 && *shutdown <= 86400))
    return fail(cmd, "flag --shutdown-timeout must be in [0, 86400] seconds");
  o.shutdown_timeout_s = *shutdown;
  o.insecure_no_auth = args->has("--insecure-no-auth");
  o.enable_test_hooks = args->has("--enable-test-hooks");  // hidden: tests force sampled tokens with it
  o.log_requests = !args->has("--quiet");
  o.allow_special_in_content = args->has("--allow-special-in-content");
  auto s = server::serve(o);
  if (!s) return fail(cmd, s.message());
  return 0;
}

}  // namespace deltaflow::cli
