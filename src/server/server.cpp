#include "server/server.hpp"

#include <pthread.h>
#include <sys/resource.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "server/auth.hpp"
#include "server/cors.hpp"
#include "server/routes.hpp"

namespace deltaflow::server {

namespace {

const char* route_label(const std::string& path) {
  static const char* kRoutes[] = {
      "/health",      "/metrics",  "/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize",
      "/detokenize",  "/api/chat", "/api/generate",        "/api/tags",       "/api/show",  "/api/ps",
      "/api/version", "/"};
  for (const char* r : kRoutes)
    if (path == r) return r;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/:id";
  return "other";
}

bool is_ollama_path(const std::string& path) {
  return path.rfind("/api/", 0) == 0;
}

// Each connection holds a descriptor; the usual soft limit (1024) would refuse clients long before
// --max-connections. Raise it to the hard limit, as vLLM does.
void raise_open_files_limit(size_t want) {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return;
  const rlim_t need = static_cast<rlim_t>(want) + 256;
  if (r.rlim_cur >= need) return;
  r.rlim_cur = std::min(r.rlim_max, std::max(need, r.rlim_cur));
  setrlimit(RLIMIT_NOFILE, &r);
}

// The graceful stop: no new connections (the listening socket closes, idle keep-alive connections close) and
// 503 for requests still read on open ones; the running requests finish, for at most `timeout_s`; then the
// engine aborts the rest, whose clients get a clean final event (finish_reason "abort").
void drain(http::Server& svr, ServerContext& ctx, ServedModel& model, double timeout_s) {
  using namespace std::chrono;
  ctx.draining.store(true);
  svr.stop_accepting();
  const auto st = model.scheduler().stats();
  std::fprintf(
      stderr, "deltaflow serve: stopping: no new requests; %lld running, %lld waiting, up to %gs to finish\n",
      static_cast<long long>(st.running), static_cast<long long>(st.waiting), timeout_s);
  const auto deadline =
      steady_clock::now() + duration_cast<steady_clock::duration>(duration<double>(timeout_s));
  while (svr.requests_in_flight() > 0 && steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(20));
  if (svr.requests_in_flight() == 0) return;
  const auto left = model.scheduler().stats();
  std::fprintf(stderr, "deltaflow serve: --shutdown-timeout reached: aborting %lld running, %lld waiting\n",
               static_cast<long long>(left.running), static_cast<long long>(left.waiting));
  model.scheduler().abort_all();
  // The final events are out; let them be written (a client that does not read is cut later).
  const auto cap = steady_clock::now() + seconds(10);
  while (svr.requests_in_flight() > 0 && steady_clock::now() < cap)
    std::this_thread::sleep_for(milliseconds(20));
}

}  // namespace

core::Status serve(const ServeOptions& o) {
  if (o.api_key.empty() && !is_loopback_host(o.host) && !o.insecure_no_auth)
    return core::Error{"--host " + o.host +
                       " is reachable from other machines: give --api-key KEY (or --api-key-file F), or "
                       "--insecure-no-auth to serve without one"};
  if (o.port < 0 || o.port > 65535) return core::Error{"--port must be in [0, 65535]"};

  // Signals: SIGPIPE would kill the process on a write to a closed socket (Asio sends with MSG_NOSIGNAL;
  // ignored anyway, for any other write); SIGINT/SIGTERM are taken by one thread with sigwait, so every other
  // thread (created below, inheriting this mask) is never interrupted.
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ServerContext ctx;
  ctx.options = o;
  ctx.started_unix = unix_now();
  raise_open_files_limit(o.http.max_connections * 2);
  http::Server svr(o.http);

  svr.set_pre_routing([&ctx](const http::Request& req, http::Response& res) {
    if (ctx.draining.load()) {
      res.set_header("Connection", "close");
      res.set_header("Retry-After", "5");
      send_error(res, unavailable("the server is shutting down"), is_ollama_path(req.path));
      return true;
    }
    const std::string origin = req.header("Origin");
    switch (check_origin(ctx.options.allowed_origins, origin, req.header("Host"))) {
      case OriginCheck::kRefused:
        send_error(res,
                   ApiError{403, "origin " + origin + " is not allowed (serve --allowed-origins)",
                            "invalid_request_error", "", "origin_not_allowed"},
                   is_ollama_path(req.path));
        return true;
      case OriginCheck::kAllowed:
        res.set_header("Access-Control-Allow-Origin", origin);
        res.set_header("Vary", "Origin");
        if (req.method == "OPTIONS") {
          res.status = 204;
          res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
          const std::string asked = req.header("Access-Control-Request-Headers");
          res.set_header("Access-Control-Allow-Headers",
                         asked.empty() ? "Authorization, Content-Type" : asked);
          res.set_header("Access-Control-Max-Age", "600");
          return true;
        }
        break;
      case OriginCheck::kSameOrigin:
      case OriginCheck::kNone:
        break;
    }
    if (req.path == "/health" || (req.method == "GET" && is_web_path(req.path)) ||
        ctx.options.api_key.empty())
      return false;
    if (bearer_matches(req.header("Authorization"), ctx.options.api_key)) return false;
    send_error(res, unauthorized(), is_ollama_path(req.path));
    return true;
  });
  // Errors the HTTP layer answers itself (malformed requests, no route, too large, too slow, too many
  // connections), in the format of the API the path belongs to.
  svr.set_error_page(
      [&ctx](const http::Request& req, int status, const std::string& message, http::Response& res) {
        const bool ollama = is_ollama_path(req.path);
        switch (status) {
          case 413:
            return send_error(res, too_large(ctx.options.http.max_body_bytes), ollama);
          case 404:
            return send_error(res, not_found(message), ollama);
          case 503:
            res.set_header("Retry-After", "1");
            return send_error(res, unavailable(message), ollama);
          case 500:
            return send_error(res, internal_error(message), ollama);
          default:
            return send_error(res, ApiError{status, message, "invalid_request_error", "", ""}, ollama);
        }
      });
  svr.set_logger([&ctx](const http::Request& req, const http::Response& res) {
    ctx.metrics.request(route_label(req.path), res.status);
    if (ctx.options.log_requests)
      std::fprintf(stderr, "deltaflow serve: %s %s %d\n", req.method.c_str(), req.path.c_str(), res.status);
  });

  svr.route("GET", "/health", [&ctx](const http::Request&, http::Response& res) {
    if (ctx.model.load())
      send_json(res, {{"status", "ok"}});
    else
      send_json(res, {{"status", "loading"}}, 503);
  });
  svr.route("GET", "/metrics", [&ctx, &svr](const http::Request&, http::Response& res) {
    QueueState q;
    q.http_connections = static_cast<int64_t>(svr.open_connections());
    q.http_requests_in_flight = static_cast<int64_t>(svr.requests_in_flight());
    if (ServedModel* m = ctx.model.load()) {
      q.loaded = true;
      const engine::SchedulerStats st = m->scheduler().stats();
      q.waiting = static_cast<size_t>(st.waiting);
      q.running = static_cast<size_t>(st.running);
      q.kv_pages_used = st.kv_pages_used;
      q.kv_pages_total = st.kv_pages_total;
      q.state_slots_used = st.state_slots_used;
      q.state_slots_total = st.state_slots_total;
      q.prefix_checkpoints = st.prefix_checkpoints;
      q.kv_pages_cache_only = st.kv_pages_cache_only;
      q.prefix_cache_bytes = st.prefix_cache_bytes;
      q.prefix_evictions = st.prefix_evictions;
      q.preemptions = st.preemptions;
      q.drafted_at = st.drafted_at;
      q.accepted_at = st.accepted_at;
    }
    res.set_content(ctx.metrics.render(q), "text/plain; version=0.0.4; charset=utf-8");
  });
  add_openai_routes(svr, ctx);
  add_ollama_routes(svr, ctx);
  add_web_routes(svr);

  auto bound = svr.bind(o.host, o.port);
  if (!bound) return core::Error{bound.message()};
  const int port = *bound;
  std::fprintf(stderr, "deltaflow serve: listening on http://%s:%d (loading the model)\n", o.host.c_str(),
               port);

  std::atomic<bool> stopping{false};
  std::atomic<bool> all_done{false};
  std::thread http([&] { svr.run(); });
  std::thread signals([&] {
    timespec tick{0, 100'000'000};
    while (!all_done.load()) {
      if (sigtimedwait(&stop_signals, nullptr, &tick) > 0) {
        if (stopping.exchange(true)) {
          std::fprintf(stderr, "deltaflow serve: second signal, exiting now\n");
          std::_Exit(1);
        }
        std::fprintf(stderr, "deltaflow serve: stopping\n");
      }
    }
  });
  auto finish = [&](core::Status s) {
    stopping.store(true);
    svr.stop();
    http.join();
    all_done.store(true);
    signals.join();
    return s;
  };

  ModelLoadOptions lo;
  lo.model_dir = o.model_dir;
  lo.device = o.device;
  lo.tensor_parallel = o.tensor_parallel;
  lo.served_name = o.served_model_name;
  lo.engine = o.engine;
  lo.allow_special_in_content = o.allow_special_in_content;
  auto loaded = ServedModel::load(lo);
  if (!loaded) return finish(core::Error{loaded.message()});
  std::unique_ptr<ServedModel> model = std::move(*loaded);
  ctx.defaults = resolve_request_defaults(*model, o.default_enable_thinking, o.default_max_tokens);
  if (o.max_tokens_limit > 0) ctx.defaults.generation.max_tokens_limit = o.max_tokens_limit;
  if (!stopping.load()) {
    ctx.model.store(model.get());
    const auto& d = ctx.defaults;
    const std::string max_tokens =
        d.generation.max_tokens ? std::to_string(*d.generation.max_tokens) : std::string("the context");
    std::fprintf(
        stderr,
        "deltaflow serve: ready: model '%s' (%s, %lld positions; defaults: thinking %s, max_tokens %s) "
        "on http://%s:%d\n",
        model->name().c_str(), model->device_name(), static_cast<long long>(model->max_model_len()),
        d.enable_thinking ? "on" : "off", max_tokens.c_str(), o.host.c_str(), port);
  }
  while (!stopping.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  drain(svr, ctx, *model, o.shutdown_timeout_s);
  // Engine first (what is left ends, so HTTP threads return), then HTTP, then the model.
  model->scheduler().stop();
  auto s = finish(core::Status());
  ctx.model.store(nullptr);
  model.reset();
  return s;
}

}  // namespace deltaflow::server
