// An event-driven HTTP/1.1 server (Boost.Beast's parser over Boost.Asio, one I/O thread): connections wait
// and requests are read without holding a thread, under deadlines (headers, body, idle keep-alive); a
// complete request goes to a handler thread (worker_pool.hpp), and its response is written by the I/O thread
// from a bounded buffer. Pipelined requests on a connection are answered in order; past the connection cap a
// client gets 503 at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/status.hpp"
#include "http/message.hpp"
#include "http/router.hpp"

namespace deltaflow::http {

struct ServerOptions {
  size_t max_connections = 1024;          // more are answered 503 and closed
  size_t max_body_bytes = 8u << 20;       // larger bodies (by Content-Length or chunked) get 413
  size_t max_header_bytes = 64u << 10;    // larger request heads get 431
  double header_timeout_s = 10;           // a request's head must arrive within this (else 408 and close)
  double body_timeout_s = 60;             // its body within this after the head
  double keep_alive_timeout_s = 30;       // an idle connection closes after this
  double write_timeout_s = 30;            // a client that takes no bytes for this long is cut off
  size_t stream_buffer_bytes = 1u << 20;  // bytes a response may queue unsent before its handler waits
};

// Fills the response for an error the server itself answers (400 malformed, 404, 405, 408, 413, 431, 503).
// `req` holds what was parsed (its path may be empty).
using ErrorPage = std::function<void(const Request& req, int status, const std::string& message, Response&)>;

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void route(std::string method, std::string pattern, Handler handler);
  // Runs before routing, on the handler thread; true: it answered the request.
  void set_pre_routing(std::function<bool(const Request&, Response&)> hook);
  void set_error_page(ErrorPage page);
  // After each response is complete (streamed ones when their producer returns).
  void set_logger(std::function<void(const Request&, const Response&)> log);

  // Binds and listens (backlog 1024); port 0 picks one. Returns the port.
  core::Expected<int> bind(const std::string& host, int port);
  // Serves until stop(); call from one thread, after bind().
  void run();
  // Closes the listening socket; connections idle between requests close, open requests go on and their
  // connections close after their response.
  void stop_accepting();
  // Ends everything: connections close, streams' sinks fail; waits for the handlers to return, and run()
  // returns.
  void stop();

  size_t open_connections() const;
  size_t requests_in_flight() const;

  struct Impl;  // server.cpp's; public so that its connections may name it

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltaflow::http
