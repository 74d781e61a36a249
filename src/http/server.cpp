// The connection state machine. One I/O thread runs every socket operation and timer; handler threads only
// queue response bytes (enqueue) and post the write to the I/O thread. Per connection:
//   read head (deadline) -> [100 Continue] -> read body (deadline) -> dispatch to a handler thread, with a
//   read kept pending meanwhile to notice a client that closes -> write the response as it is queued ->
//   next request (pipelined bytes are already in the buffer) or wait idle (keep-alive deadline) or close.
#include "http/server.hpp"

// Boost 1.74's Asio uses std::exchange without including <utility> (an error with GCC 12).
#include <utility>

#include <strings.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "http/request_parse.hpp"
#include "http/worker_pool.hpp"

namespace deltaflow::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

class Session;

std::chrono::steady_clock::duration seconds_of(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

struct Server::Impl {
  explicit Impl(ServerOptions o) : opt(std::move(o)), limits{opt.max_header_bytes, opt.max_body_bytes} {}

  ServerOptions opt;
  ParseLimits limits;  // opt's, as the parser takes them
  Router router;
  std::function<bool(const Request&, Response&)> pre_routing;
  ErrorPage error_page;
  std::function<void(const Request&, const Response&)> logger;

  // Declared before the I/O context: sessions that its destructor releases still find these.
  std::mutex sessions_mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
  std::atomic<size_t> connections{0};  // sessions under the cap (rejected ones not counted)
  std::atomic<size_t> rejecting{0};
  std::atomic<size_t> in_flight{0};  // requests read and not yet answered in full
  std::atomic<bool> draining{false};
  std::atomic<bool> stopped{false};

  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  WorkerPool pool;

  void accept();
  // I/O thread: no new connections; then every connection closes, or only those idle between requests.
  void close_listener(bool every_connection);
  std::vector<std::shared_ptr<Session>> live_sessions();
  void fill_error(const Request& req, int status, const std::string& message, Response& res) const {
    res = Response{};
    res.status = status;
    if (error_page)
      error_page(req, status, message, res);
    else
      res.set_content(message + "\n", "text/plain");
    res.status = status;
  }
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Server::Impl& srv, tcp::socket sock, bool reject)
      : srv_(srv), sock_(std::move(sock)), timer_(srv.io), reject_(reject) {
    (reject_ ? srv_.rejecting : srv_.connections).fetch_add(1);
  }
  ~Session() {
    (reject_ ? srv_.rejecting : srv_.connections).fetch_sub(1);
    if (in_request_) srv_.in_flight.fetch_sub(1);
    std::lock_guard<std::mutex> lock(srv_.sessions_mu);
    srv_.sessions.erase(this);
  }

  void start() {
    if (reject_) {
      Request none;
      answer_error(none, 503, "the server is at its connection limit; try again shortly");
      return;
    }
    read_request();
  }

  // I/O thread: the connection ends now (anything queued is dropped; a handler's sink fails).
  void close() {
    if (closed_) return;
    closed_ = true;
    ++deadline_gen_;
    timer_.cancel();
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed_ = true;
    }
    cv_.notify_all();
    end_request();
    error_code ignored;
    sock_.shutdown(tcp::socket::shutdown_both, ignored);
    sock_.close(ignored);
  }

  // I/O thread, on stop_accepting(): a connection waiting between requests closes.
  void close_if_idle() {
    if (idle_) close();
  }

  // Handler thread: queues response bytes for the client. `last` ends the response; `keep` then says whether
  // the connection takes another request. Waits while more than the stream buffer is unsent, for up to the
  // write timeout. False once the connection has failed.
  bool enqueue(std::string data, bool last, bool keep) {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_) return false;
    pending_ += data;
    if (last) {
      last_queued_ = true;
      keep_after_ = keep;
    }
    if (!writing_) {
      writing_ = true;
      asio::post(srv_.io, [self = shared_from_this()] { self->write_more(); });
    }
    if (last) return true;
    const auto deadline = std::chrono::steady_clock::now() + seconds_of(srv_.opt.write_timeout_s);
    while (!failed_ && !gone_.load() && pending_.size() > srv_.opt.stream_buffer_bytes) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
          pending_.size() > srv_.opt.stream_buffer_bytes) {
        failed_ = true;  // the client takes nothing: cut it off
        asio::post(srv_.io, [self = shared_from_this()] { self->close(); });
        break;
      }
    }
    return !failed_;
  }

  bool gone() const { return gone_.load(); }
  bool failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }

 private:
  // ---- reading (I/O thread) ----

  void read_request() {
    if (closed_) return;
    if (srv_.draining.load() && !first_) return close();
    parser_.emplace();
    apply_limits(*parser_, srv_.limits);
    if (buf_.size() > 0 || first_) return read_head();
    // Between requests: wait for the next one's first bytes, for the keep-alive time.
    idle_ = true;
    set_deadline(srv_.opt.keep_alive_timeout_s);
    sock_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
      self->idle_ = false;
      self->buf_.commit(n);
      if (ec) return self->close();  // idle too long, or the client closed: nothing was asked
      self->read_head();
    });
  }

  void read_head() {
    set_deadline(srv_.opt.header_timeout_s);
    bhttp::async_read_header(sock_, buf_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->read_failed(ec);
      self->on_head();
    });
  }

  void on_head() {
    if (parser_->is_done()) return dispatch();
    const auto& msg = parser_->get();
    const auto expect = msg[bhttp::field::expect];
    if (expect.size() == 12 && strncasecmp(expect.data(), "100-continue", 12) == 0) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      set_deadline(srv_.opt.write_timeout_s);
      asio::async_write(sock_, asio::buffer(kContinue), [self = shared_from_this()](error_code ec, size_t) {
        if (ec) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    set_deadline(srv_.opt.body_timeout_s);
    bhttp::async_read(sock_, buf_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->read_failed(ec);
      self->dispatch();
    });
  }

  // What was parsed of a request that failed, for the error page (its path picks the API's error format).
  // The start line is stored as soon as it is parsed, before the headers are done.
  Request partial_request() { return parser_ ? request_from(parser_->get()) : Request{}; }

  void read_failed(error_code ec) {
    const bool timed_out = timed_out_;
    set_deadline(0);
    if (closed_) return;
    if (timed_out) {
      // Some bytes of a request came, not all of it in time (a slow or stalled client, or a body shorter
      // than its Content-Length).
      if (buf_.size() == 0 && !(parser_ && parser_->got_some())) return close();
      return answer_error(partial_request(), 408, "the request was not received in time");
    }
    if (ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted || ec == asio::error::broken_pipe)
      return close();  // the client went away (or the server is stopping)
    const ParseFailure f = parse_failure(ec, srv_.limits);
    if (f.status == 0) return close();
    answer_error(partial_request(), f.status, f.message);
  }

  // Answers an error the server found itself, then closes the connection (what follows on it cannot be
  // trusted to start a request).
  void answer_error(const Request& req, int status, const std::string& message) {
    Response res;
    srv_.fill_error(req, status, message, res);
    begin_request();
    std::string out = serialize_head(res, 11, false, res.body.size(), false);
    out += res.body;
    if (srv_.logger && !req.method.empty()) srv_.logger(req, res);
    enqueue(std::move(out), true, false);
  }

  void dispatch() {
    set_deadline(0);
    auto& msg = parser_->get();
    const bool keep_alive = msg.keep_alive();
    Request req = request_from(msg);
    error_code ec;
    const auto ep = sock_.remote_endpoint(ec);
    if (!ec) req.remote = ep.address().to_string() + ":" + std::to_string(ep.port());
    keep_alive_ = keep_alive && !srv_.draining.load();
    first_ = false;
    parser_.reset();
    begin_request();
    watch();
    auto self = shared_from_this();
    if (!srv_.pool.submit([self, req = std::move(req)]() mutable { self->handle(std::move(req)); })) close();
  }

  // While a handler runs: a read that notices the client closing (its end of stream). Bytes that arrive are
  // the next pipelined request's and stay in the buffer (up to 64 KiB read ahead).
  void watch() {
    if (watching_ || closed_ || buf_.size() >= (64u << 10)) return;
    watching_ = true;
    sock_.async_read_some(buf_.prepare(16u << 10), [self = shared_from_this()](error_code ec, size_t n) {
      self->watching_ = false;
      self->buf_.commit(n);
      if (ec && ec != asio::error::operation_aborted) {
        self->gone_.store(true);
        self->cv_.notify_all();
      }
      if (self->lingering_) {
        if (ec) return self->close();
        return self->drain_more();
      }
      if (self->resume_after_watch_) {
        self->resume_after_watch_ = false;
        if (self->gone_.load()) return self->close();
        return self->read_request();
      }
      if (!ec && self->in_request_) self->watch();
    });
  }

  // ---- the handler (a worker thread) ----

  class Sink : public ChunkSink {
   public:
    Sink(Session& s, bool chunked) : s_(s), chunked_(chunked) {}
    bool write(std::string_view data) override {
      if (s_.gone()) return false;
      if (data.empty()) return true;
      std::string frame;
      if (chunked_) {
        char size[24];
        std::snprintf(size, sizeof size, "%zx\r\n", data.size());
        frame.reserve(data.size() + 16);
        frame += size;
        frame += data;
        frame += "\r\n";
      } else {
        frame.assign(data);
      }
      return s_.enqueue(std::move(frame), false, true);
    }
    bool gone() const override { return s_.gone() || s_.failed(); }

   private:
    Session& s_;
    bool chunked_;
  };

  void handle(Request req) {
    Response res;
    try {
      if (!(srv_.pre_routing && srv_.pre_routing(req, res))) {
        const Router::Found f = srv_.router.find(req);
        if (f.outcome == Router::Outcome::kFound)
          (*f.handler)(req, res);
        else if (f.outcome == Router::Outcome::kNoMethod)
          srv_.fill_error(req, 405, "method " + req.method + " is not allowed on " + req.path, res);
        else
          srv_.fill_error(req, 404, "no route " + req.method + " " + req.path, res);
      }
    } catch (const std::exception& e) {
      srv_.fill_error(req, 500, std::string("internal error: ") + e.what(), res);
    } catch (...) {
      srv_.fill_error(req, 500, "internal error", res);
    }
    bool keep = keep_alive_ && strcasecmp(res.header("Connection").c_str(), "close") != 0;
    const bool head_only = req.method == "HEAD";
    // The logger (metrics) sees the request before its last bytes are queued, so a client that has its answer
    // finds it counted.
    auto log = [&] {
      if (srv_.logger) srv_.logger(req, res);
    };
    if (!res.producer) {
      std::string out = serialize_head(res, req.version, keep, res.body.size(), false);
      if (!head_only) out += res.body;
      log();
      enqueue(std::move(out), true, keep);
    } else {
      const bool chunked = req.version >= 11;  // HTTP/1.0: the body ends when the connection closes
      if (!chunked) keep = false;
      if (head_only) log();
      const bool head_out = enqueue(serialize_head(res, req.version, keep, 0, chunked), head_only, keep);
      if (!head_only) {
        bool complete = true;
        if (head_out) {
          Sink sink(*this, chunked);
          try {
            res.producer(sink);
          } catch (...) {
            complete = false;  // the status is out already: cut the body short, the client sees it incomplete
          }
        }
        log();
        if (complete)
          enqueue(chunked ? "0\r\n\r\n" : "", true, keep);
        else
          enqueue("", true, false);
      }
    }
    res.producer = nullptr;  // what the producer holds (a generation) is released on this thread
  }

  // ---- writing (I/O thread) ----

  void write_more() {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_ || closed_) {
      writing_ = false;
      cv_.notify_all();
      return;
    }
    if (pending_.empty()) {
      writing_ = false;
      const bool done = last_queued_;
      const bool keep = keep_after_;
      last_queued_ = false;
      cv_.notify_all();
      lock.unlock();
      if (done) response_done(keep);
      return;
    }
    inflight_.clear();
    inflight_.swap(pending_);
    cv_.notify_all();
    lock.unlock();
    set_deadline(srv_.opt.write_timeout_s);
    asio::async_write(sock_, asio::buffer(inflight_), [self = shared_from_this()](error_code ec, size_t) {
      self->set_deadline(0);
      if (ec) return self->close();
      self->write_more();
    });
  }

  void response_done(bool keep) {
    end_request();
    if (!keep || gone_.load() || srv_.draining.load()) return linger_close();
    if (watching_) {
      resume_after_watch_ = true;
      error_code ignored;
      sock_.cancel(ignored);
      return;
    }
    read_request();
  }

  // After a last response: stop sending, then read what the client still sends (briefly) before closing, so
  // the kernel does not answer unread bytes with a reset that could destroy the response in flight.
  void linger_close() {
    if (closed_) return;
    lingering_ = true;
    error_code ignored;
    sock_.shutdown(tcp::socket::shutdown_send, ignored);
    set_deadline(2.0);  // then the pending read is cancelled, and its handler closes
    if (!watching_) drain_more();
  }

  void drain_more() {
    sock_.async_read_some(asio::buffer(discard_), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->close();
      self->drain_more();
    });
  }

  // ---- bookkeeping (I/O thread) ----

  void begin_request() {
    if (!in_request_) {
      in_request_ = true;
      srv_.in_flight.fetch_add(1);
    }
  }
  void end_request() {
    if (in_request_) {
      in_request_ = false;
      srv_.in_flight.fetch_sub(1);
    }
  }

  // A deadline for the socket operations now pending (0: none). When it passes, they are cancelled and
  // their handlers see timed_out_.
  void set_deadline(double seconds) {
    ++deadline_gen_;
    timed_out_ = false;
    if (seconds <= 0) {
      timer_.cancel();
      return;
    }
    timer_.expires_after(seconds_of(seconds));
    timer_.async_wait([self = shared_from_this(), gen = deadline_gen_](error_code ec) {
      if (ec || gen != self->deadline_gen_ || self->closed_) return;
      self->timed_out_ = true;
      error_code ignored;
      self->sock_.cancel(ignored);
    });
  }

  Server::Impl& srv_;
  tcp::socket sock_;
  asio::steady_timer timer_;
  const bool reject_;
  uint64_t deadline_gen_ = 0;
  bool timed_out_ = false;
  beast::flat_buffer buf_;
  std::optional<RequestParser> parser_;
  char discard_[4096];
  bool first_ = true;
  bool idle_ = false;
  bool watching_ = false;
  bool resume_after_watch_ = false;
  bool lingering_ = false;
  bool keep_alive_ = true;
  bool in_request_ = false;
  bool closed_ = false;

  // Shared with the handler thread.
  std::mutex mu_;
  std::condition_variable cv_;
  std::string pending_, inflight_;
  bool writing_ = false;
  bool last_queued_ = false;
  bool keep_after_ = false;
  bool failed_ = false;
  std::atomic<bool> gone_{false};
};

}  // namespace

void Server::Impl::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket sock) {
    if (ec) {
      if (!acceptor.is_open() || ec == asio::error::operation_aborted) return;
      // Out of descriptors, or a connection reset before it was taken: try again shortly.
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](error_code e) {
        if (!e && acceptor.is_open()) accept();
      });
      return;
    }
    error_code ignored;
    // Heads and bodies go out in separate writes; without TCP_NODELAY each would wait on a delayed ACK.
    sock.set_option(tcp::no_delay(true), ignored);
    const bool over = connections.load() >= opt.max_connections;
    if (over && rejecting.load() >= opt.max_connections) {
      sock.close(ignored);  // a flood: not even a 503
    } else {
      auto s = std::make_shared<Session>(*this, std::move(sock), over);
      {
        std::lock_guard<std::mutex> lock(sessions_mu);
        sessions.emplace(s.get(), s);
      }
      s->start();
    }
    accept();
  });
}

void Server::Impl::close_listener(bool every_connection) {
  error_code ignored;
  acceptor.close(ignored);
  accept_retry.cancel();
  for (auto& s : live_sessions()) {
    if (every_connection)
      s->close();
    else
      s->close_if_idle();
  }
}

std::vector<std::shared_ptr<Session>> Server::Impl::live_sessions() {
  std::vector<std::shared_ptr<Session>> out;
  std::lock_guard<std::mutex> lock(sessions_mu);
  for (auto& [p, w] : sessions)
    if (auto s = w.lock()) out.push_back(std::move(s));
  return out;
}

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() {
  stop();
}

void Server::route(std::string method, std::string pattern, Handler handler) {
  impl_->router.add(std::move(method), std::move(pattern), std::move(handler));
}

void Server::set_pre_routing(std::function<bool(const Request&, Response&)> hook) {
  impl_->pre_routing = std::move(hook);
}

void Server::set_error_page(ErrorPage page) {
  impl_->error_page = std::move(page);
}

void Server::set_logger(std::function<void(const Request&, const Response&)> log) {
  impl_->logger = std::move(log);
}

core::Expected<int> Server::bind(const std::string& host, int port) {
  error_code ec;
  tcp::resolver resolver(impl_->io);
  const auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || results.empty())
    return core::Error{"cannot bind " + host + ":" + std::to_string(port) +
                       " (not an address here: " + ec.message() + ")"};
  std::string last;
  for (const auto& r : results) {
    auto& a = impl_->acceptor;
    error_code e;
    a.open(r.endpoint().protocol(), e);
    if (!e) a.set_option(tcp::acceptor::reuse_address(true), e);
    if (!e) a.bind(r.endpoint(), e);
    if (!e) a.listen(1024, e);
    if (!e) return static_cast<int>(a.local_endpoint().port());
    last = e.message();
    error_code ignored;
    a.close(ignored);
  }
  return core::Error{"cannot bind " + host + ":" + std::to_string(port) + " (" + last + ")"};
}

void Server::run() {
  impl_->work.emplace(impl_->io.get_executor());
  impl_->accept();
  impl_->io.run();
}

void Server::stop_accepting() {
  impl_->draining.store(true);
  asio::post(impl_->io, [impl = impl_.get()] { impl->close_listener(/*every_connection=*/false); });
}

void Server::stop() {
  if (impl_->stopped.exchange(true)) return;
  impl_->draining.store(true);
  asio::post(impl_->io, [impl = impl_.get()] { impl->close_listener(/*every_connection=*/true); });
  // Handlers see their sinks fail (or were ended by their owner) and return; then the I/O thread stops.
  impl_->pool.join();
  impl_->work.reset();
  impl_->io.stop();
}

size_t Server::open_connections() const {
  return impl_->connections.load();
}

size_t Server::requests_in_flight() const {
  return impl_->in_flight.load();
}

}  // namespace deltaflow::http
