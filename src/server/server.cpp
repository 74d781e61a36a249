#include "server/server.hpp"

#include <pthread.h>
#include <sys/socket.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "server/auth.hpp"
#include "server/cors.hpp"
#include "server/routes.hpp"

namespace deltaflow::server {

namespace {

// httplib's listen backlog is compiled into the Debian library as 5; a burst of clients would see SYN
// retries (seconds). listen() again on the bound socket raises it.
class Listener : public httplib::Server {
 public:
  int fd() const { return static_cast<int>(svr_sock_.load()); }
};

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

// The graceful stop: no new connections (the listening socket closes) and 503 for requests still read on
// open ones; the running requests finish, for at most `timeout_s`; then the engine aborts the rest, whose
// clients get a clean final event (finish_reason "abort"), and their HTTP threads end.
void drain(Listener& svr, ServerContext& ctx, ServedModel& model, const std::atomic<bool>& http_done,
           double timeout_s) {
  using namespace std::chrono;
  ctx.draining.store(true);
  // Not httplib's stop(): that also ends every response being streamed. Shut the listening socket down
  // instead: the accept loop ends (httplib closes the socket), then waits for the connections being served,
  // whose streams go on; http_done once they are all over.
  ::shutdown(svr.fd(), SHUT_RDWR);
  const auto st = model.scheduler().stats();
  std::fprintf(
      stderr, "deltaflow serve: stopping: no new requests; %lld running, %lld waiting, up to %gs to finish\n",
      static_cast<long long>(st.running), static_cast<long long>(st.waiting), timeout_s);
  const auto deadline =
      steady_clock::now() + duration_cast<steady_clock::duration>(duration<double>(timeout_s));
  while (!http_done.load() && steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds(20));
  if (http_done.load()) return;
  const auto left = model.scheduler().stats();
  std::fprintf(stderr, "deltaflow serve: --shutdown-timeout reached: aborting %lld running, %lld waiting\n",
               static_cast<long long>(left.running), static_cast<long long>(left.waiting));
  model.scheduler().abort_all();
  // The final events are out; let the HTTP threads write them (a client that does not read is cut later).
  const auto cap = steady_clock::now() + seconds(10);
  while (!http_done.load() && steady_clock::now() < cap) std::this_thread::sleep_for(milliseconds(20));
}

}  // namespace

core::Status serve(const ServeOptions& o) {
  if (o.api_key.empty() && !is_loopback_host(o.host) && !o.insecure_no_auth)
    return core::Error{"--host " + o.host +
                       " is reachable from other machines: give --api-key KEY (or --api-key-file F), or "
                       "--insecure-no-auth to serve without one"};
  if (o.port < 0 || o.port > 65535) return core::Error{"--port must be in [0, 65535]"};

  // Signals: SIGPIPE would kill the process on a write to a closed socket (httplib sends without
  // MSG_NOSIGNAL); SIGINT/SIGTERM are taken by one thread with sigwait, so every other thread (created
  // below, inheriting this mask) is never interrupted.
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ServerContext ctx;
  ctx.options = o;
  ctx.started_unix = unix_now();
  Listener svr;
  const size_t threads = std::min<size_t>(1024, std::max<size_t>(16, o.engine.max_queue + 32));
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(o.max_body_bytes);
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  svr.set_keep_alive_timeout(5);
  svr.set_keep_alive_max_count(1000);
  // Headers and body go out in separate writes: without TCP_NODELAY, Nagle + delayed ACK add ~40 ms per
  // response on a kept-alive connection, and delay each streamed token.
  svr.set_tcp_nodelay(true);
  // httplib's default socket options add SO_REUSEPORT, which lets a second server bind the same port and
  // silently share its connections; keep only SO_REUSEADDR so a taken port is an error.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });

  svr.set_pre_routing_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (ctx.draining.load()) {
      res.set_header("Connection", "close");
      res.set_header("Retry-After", "5");
      send_error(res, unavailable("the server is shutting down"), is_ollama_path(req.path));
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::string origin = req.get_header_value("Origin");
    switch (check_origin(ctx.options.allowed_origins, origin, req.get_header_value("Host"))) {
      case OriginCheck::kRefused:
        // Answered before the body is read: the connection cannot carry another request.
        res.set_header("Connection", "close");
        send_error(res,
                   ApiError{403, "origin " + origin + " is not allowed (serve --allowed-origins)",
                            "invalid_request_error", "", "origin_not_allowed"},
                   is_ollama_path(req.path));
        return httplib::Server::HandlerResponse::Handled;
      case OriginCheck::kAllowed:
        res.set_header("Access-Control-Allow-Origin", origin);
        res.set_header("Vary", "Origin");
        if (req.method == "OPTIONS") {
          res.status = 204;
          res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
          const std::string asked = req.get_header_value("Access-Control-Request-Headers");
          res.set_header("Access-Control-Allow-Headers",
                         asked.empty() ? "Authorization, Content-Type" : asked);
          res.set_header("Access-Control-Max-Age", "600");
          return httplib::Server::HandlerResponse::Handled;
        }
        break;
      case OriginCheck::kSameOrigin:
      case OriginCheck::kNone:
        break;
    }
    if (req.path == "/health" || (req.method == "GET" && is_web_path(req.path)) ||
        ctx.options.api_key.empty())
      return httplib::Server::HandlerResponse::Unhandled;
    if (bearer_matches(req.get_header_value("Authorization"), ctx.options.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Connection", "close");  // the unread body would be taken for the next request
    send_error(res, unauthorized(), is_ollama_path(req.path));
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler(
      httplib::Server::HandlerWithResponse([&ctx](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const bool ollama = is_ollama_path(req.path);
        if (res.status == 413)
          send_error(res, too_large(ctx.options.max_body_bytes), ollama);
        else if (res.status == 404)
          send_error(res, not_found("no route " + req.method + " " + req.path), ollama);
        else
          send_error(res,
                     ApiError{res.status, "HTTP error " + std::to_string(res.status), "invalid_request_error",
                              "", ""},
                     ollama);
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
    send_error(res, internal_error("internal error"), is_ollama_path(req.path));
  });
  svr.set_logger([&ctx](const httplib::Request& req, const httplib::Response& res) {
    ctx.metrics.request(route_label(req.path), res.status);
    if (ctx.options.log_requests)
      std::fprintf(stderr, "deltaflow serve: %s %s %d\n", req.method.c_str(), req.path.c_str(), res.status);
  });

  svr.Get("/health", [&ctx](const httplib::Request&, httplib::Response& res) {
    if (ctx.model.load())
      send_json(res, {{"status", "ok"}});
    else
      send_json(res, {{"status", "loading"}}, 503);
  });
  svr.Get("/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
    QueueState q;
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

  int port = o.port;
  if (port == 0) {
    port = svr.bind_to_any_port(o.host);
    if (port < 0) return core::Error{"cannot bind " + o.host + " (any port)"};
  } else if (!svr.bind_to_port(o.host, port)) {
    return core::Error{"cannot bind " + o.host + ":" + std::to_string(port) +
                       " (in use, or not an address here)"};
  }
  ::listen(svr.fd(), 1024);
  std::fprintf(stderr, "deltaflow serve: listening on http://%s:%d (loading the model)\n", o.host.c_str(),
               port);

  std::atomic<bool> stopping{false};
  std::atomic<bool> http_done{false};
  std::atomic<bool> all_done{false};
  std::thread http([&] {
    svr.listen_after_bind();
    http_done.store(true);
  });
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
    // stop() is a no-op until listen_after_bind has started running: repeat until the HTTP thread ends.
    while (!http_done.load()) {
      svr.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
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
  drain(svr, ctx, *model, http_done, o.shutdown_timeout_s);
  // Engine first (what is left ends, so HTTP threads return), then HTTP, then the model.
  model->scheduler().stop();
  auto s = finish(core::Status());
  ctx.model.store(nullptr);
  model.reset();
  return s;
}

}  // namespace deltaflow::server
