// The HTTP layer over real loopback sockets: pipelining, deadlines for slow heads and short bodies, the
// connection cap, body limits (Content-Length and chunked), 100-continue, streaming to slow and vanished
// clients, keep-alive, and stop() with a stream running. Timeouts are shortened to fractions of a second;
// each test's waits are bounded by a few seconds.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "http/server.hpp"

namespace deltaflow::http {
namespace {

using namespace std::chrono;

class Client {
 public:
  explicit Client(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Client() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }
  bool send(const std::string& s) {
    return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size());
  }
  // Reads until `done(received)` or the peer closes or `timeout` passes; returns what came.
  template <class Done>
  std::string read_until(Done done, milliseconds timeout = milliseconds(3000)) {
    const auto end = steady_clock::now() + timeout;
    while (!done(in_) && !closed_) {
      const auto left = duration_cast<milliseconds>(end - steady_clock::now()).count();
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      in_.append(buf, static_cast<size_t>(n));
    }
    return in_;
  }
  std::string read_all(milliseconds timeout = milliseconds(3000)) {
    return read_until([](const std::string&) { return false; }, timeout);
  }
  // Whether the server closed the connection within `timeout`.
  bool closed_within(milliseconds timeout) {
    read_all(timeout);
    return closed_;
  }
  std::string& received() { return in_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
  std::string in_;
};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

std::string get(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: t\r\n" + extra + "\r\n";
}

class HttpServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions o) {
    server_ = std::make_unique<Server>(o);
    server_->route("GET", "/hello",
                   [](const Request&, Response& r) { r.set_content("hello", "text/plain"); });
    server_->route("GET", "/echo/*",
                   [](const Request& q, Response& r) { r.set_content(q.matches[1], "text/plain"); });
    server_->route("POST", "/body", [](const Request& q, Response& r) {
      r.set_content(std::to_string(q.body.size()), "text/plain");
    });
    server_->route("GET", "/slow", [](const Request&, Response& r) {
      std::this_thread::sleep_for(milliseconds(300));
      r.set_content("slow", "text/plain");
    });
    // Streams 64 KiB chunks until the sink refuses; records how it ended.
    server_->route("GET", "/firehose", [this](const Request&, Response& r) {
      r.stream("application/octet-stream", [this](ChunkSink& sink) {
        const std::string chunk(64 << 10, 'x');
        while (sink.write(chunk)) firehose_chunks_.fetch_add(1);
        firehose_ended_.store(true);
      });
    });
    // Streams three events, then waits for the client to go (or 5 s).
    server_->route("GET", "/events", [this](const Request&, Response& r) {
      r.stream("text/event-stream", [this](ChunkSink& sink) {
        for (int i = 0; i < 3; ++i) sink.write("data: " + std::to_string(i) + "\n\n");
        const auto end = steady_clock::now() + seconds(5);
        while (!sink.gone() && steady_clock::now() < end) std::this_thread::sleep_for(milliseconds(10));
        events_saw_gone_.store(sink.gone());
      });
    });
    server_->set_error_page([](const Request& q, int status, const std::string& message, Response& r) {
      r.set_content("error " + std::to_string(status) + " at '" + q.path + "': " + message, "text/plain");
    });
    auto port = server_->bind("127.0.0.1", 0);
    ASSERT_TRUE(port) << port.message();
    port_ = *port;
    thread_ = std::thread([this] { server_->run(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }

  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> firehose_chunks_{0};
  std::atomic<bool> firehose_ended_{false};
  std::atomic<bool> events_saw_gone_{false};
};

auto has_responses(size_t n, const std::string& last_body) {
  return [n, last_body](const std::string& s) {
    return count(s, "HTTP/1.1 ") >= n && s.size() >= last_body.size() && s.ends_with(last_body);
  };
}

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  start({});
  Client c(port_);
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send(get("/slow") + get("/echo/two") + get("/hello")));
  const std::string got = c.read_until(has_responses(3, "hello"));
  ASSERT_EQ(count(got, "HTTP/1.1 200 OK"), 3u) << got;
  const size_t a = got.find("slow"), b = got.find("two"), h = got.find("hello");
  EXPECT_LT(a, b);
  EXPECT_LT(b, h);
}

TEST_F(HttpServerTest, PercentDecodedPathReachesTheRoute) {
  start({});
  Client c(port_);
  c.send(get("/echo/Qwen%2FQwen3.5-27B?x=1"));
  EXPECT_NE(c.read_until(has_responses(1, "Qwen/Qwen3.5-27B")).find("\r\n\r\nQwen/Qwen3.5-27B"),
            std::string::npos);
}

TEST_F(HttpServerTest, AVeryLongPathIsRoutedWithoutRecursion) {
  start({});
  Client c(port_);
  const std::string name(60000, 'a');
  c.send(get("/echo/" + name) + get("/" + name));
  const std::string got = c.read_until(has_responses(2, name));
  EXPECT_NE(got.find("\r\n\r\n" + name), std::string::npos);
  EXPECT_NE(got.find("HTTP/1.1 404"), std::string::npos);
}

TEST_F(HttpServerTest, SlowHeadsGet408AndDoNotDelayOthers) {
  ServerOptions o;
  o.header_timeout_s = 0.6;
  start(o);
  std::vector<std::unique_ptr<Client>> slow;
  for (int i = 0; i < 200; ++i) {
    slow.push_back(std::make_unique<Client>(port_));
    ASSERT_TRUE(slow.back()->send("GET /hello HTTP/1.1\r\nHo"));  // and nothing more
  }
  const auto t0 = steady_clock::now();
  Client c(port_);
  c.send(get("/hello"));
  EXPECT_NE(c.read_until(has_responses(1, "hello")).find("200 OK"), std::string::npos);
  EXPECT_LT(steady_clock::now() - t0, milliseconds(300)) << "a well-behaved client waited on slow ones";
  for (auto& s : slow) {
    const std::string got = s->read_all(milliseconds(3000));
    EXPECT_NE(got.find("HTTP/1.1 408"), std::string::npos) << got;
    EXPECT_NE(got.find("Connection: close"), std::string::npos);
  }
}

TEST_F(HttpServerTest, BodyShorterThanItsLengthGets408) {
  ServerOptions o;
  o.body_timeout_s = 0.5;
  start(o);
  Client c(port_);
  const auto t0 = steady_clock::now();
  c.send("POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789");
  const std::string got = c.read_all(milliseconds(3000));
  EXPECT_NE(got.find("HTTP/1.1 408"), std::string::npos) << got;
  EXPECT_LT(steady_clock::now() - t0, milliseconds(2500));
  EXPECT_EQ(server_->requests_in_flight(), 0u);
}

TEST_F(HttpServerTest, ConnectionsPastTheCapGet503AndTheCapFrees) {
  ServerOptions o;
  o.max_connections = 4;
  start(o);
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<Client>(port_));
    held.back()->send(get("/hello"));
    held.back()->read_until(has_responses(1, "hello"));
  }
  Client over(port_);
  const std::string got = over.read_all(milliseconds(2000));
  EXPECT_NE(got.find("HTTP/1.1 503"), std::string::npos) << got;
  EXPECT_NE(got.find("connection limit"), std::string::npos);
  held[0]->close();
  const auto end = steady_clock::now() + seconds(2);
  while (server_->open_connections() >= 4 && steady_clock::now() < end)
    std::this_thread::sleep_for(milliseconds(10));
  Client next(port_);
  next.send(get("/hello"));
  EXPECT_NE(next.read_until(has_responses(1, "hello")).find("200 OK"), std::string::npos);
}

TEST_F(HttpServerTest, BodiesOverTheLimitGet413ByLengthAndChunked) {
  ServerOptions o;
  o.max_body_bytes = 1000;
  start(o);
  {
    Client c(port_);
    c.send("POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n");
    const std::string got = c.read_all(milliseconds(2000));
    EXPECT_NE(got.find("HTTP/1.1 413"), std::string::npos) << got;
    EXPECT_NE(got.find("at '/body'"), std::string::npos) << "the error page sees the path";
  }
  {
    Client c(port_);
    std::string req = "POST /body HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 5; ++i) req += "1f4\r\n" + std::string(500, 'a') + "\r\n";
    req += "0\r\n\r\n";
    c.send(req);
    EXPECT_NE(c.read_all(milliseconds(2000)).find("HTTP/1.1 413"), std::string::npos);
  }
  {
    Client c(port_);
    c.send("POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: 999\r\n\r\n" + std::string(999, 'b'));
    EXPECT_NE(c.read_until(has_responses(1, "999")).find("200 OK"), std::string::npos);
  }
}

TEST_F(HttpServerTest, ExpectContinueGets100ThenTheAnswer) {
  start({});
  Client c(port_);
  c.send("POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_NE(c.read_until([](const std::string& s) {
               return s.find("\r\n\r\n") != std::string::npos;
             }).find("HTTP/1.1 100 Continue"),
            std::string::npos);
  c.send("abcde");
  EXPECT_NE(c.read_until(has_responses(2, "5")).find("HTTP/1.1 200 OK"), std::string::npos);
}

TEST_F(HttpServerTest, MalformedRequestsGet400OrAreClosed) {
  start({});
  for (const std::string& junk :
       {std::string("GARBAGE\r\n\r\n"),
        std::string("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"),
        std::string("POST /body HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"),
        std::string("GET / HTTP/1.1\r\nBad Header\r\n\r\n")}) {
    Client c(port_);
    c.send(junk);
    const std::string got = c.read_all(milliseconds(2000));
    EXPECT_TRUE(got.find("HTTP/1.1 400") == 0 || got.find("HTTP/1.1 413") == 0) << junk << " -> " << got;
  }
  Client big(port_);
  big.send("GET /hello HTTP/1.1\r\nX: " + std::string(100 << 10, 'y') + "\r\n\r\n");
  EXPECT_EQ(big.read_all(milliseconds(2000)).find("HTTP/1.1 431"), 0u);
  Client ok(port_);
  ok.send(get("/hello"));
  EXPECT_NE(ok.read_until(has_responses(1, "hello")).find("200 OK"), std::string::npos);
}

TEST_F(HttpServerTest, UnknownPathIs404AndWrongMethodIs405) {
  start({});
  Client c(port_);
  c.send(get("/nothing") + "POST /hello HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n" + get("/hello"));
  const std::string got = c.read_until(has_responses(3, "hello"));
  EXPECT_NE(got.find("HTTP/1.1 404"), std::string::npos) << got;
  EXPECT_NE(got.find("HTTP/1.1 405"), std::string::npos) << got;
  EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
}

TEST_F(HttpServerTest, HeadGetsHeadersOnly) {
  start({});
  Client c(port_);
  c.send("HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\n" + get("/echo/after"));
  const std::string got = c.read_until(has_responses(2, "after"));
  EXPECT_NE(got.find("Content-Length: 5\r\n"), std::string::npos);
  EXPECT_EQ(got.find("hello"), std::string::npos) << got;
}

TEST_F(HttpServerTest, AClientThatReadsNothingIsCutOffAndItsStreamStops) {
  ServerOptions o;
  o.write_timeout_s = 0.5;
  o.stream_buffer_bytes = 256 << 10;
  start(o);
  Client c(port_);
  c.send(get("/firehose"));
  const auto end = steady_clock::now() + seconds(10);
  while (!firehose_ended_.load() && steady_clock::now() < end) std::this_thread::sleep_for(milliseconds(20));
  EXPECT_TRUE(firehose_ended_.load()) << "the producer never learned the client was not reading";
  // What was queued stays bounded: the socket buffers plus the stream buffer, not everything produced.
  EXPECT_LT(firehose_chunks_.load(), 200);
}

TEST_F(HttpServerTest, StreamIsChunkedAndAClosedClientIsNoticed) {
  start({});
  Client c(port_);
  c.send(get("/events"));
  const std::string got =
      c.read_until([](const std::string& s) { return s.find("data: 2") != std::string::npos; });
  EXPECT_NE(got.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_NE(got.find("9\r\ndata: 0\n\n\r\n"), std::string::npos) << got;
  const auto t0 = steady_clock::now();
  c.close();
  while (!events_saw_gone_.load() && steady_clock::now() - t0 < seconds(3))
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_TRUE(events_saw_gone_.load());
  EXPECT_LT(steady_clock::now() - t0, seconds(1));
}

TEST_F(HttpServerTest, IdleKeepAliveConnectionsClose) {
  ServerOptions o;
  o.keep_alive_timeout_s = 0.3;
  start(o);
  Client c(port_);
  c.send(get("/hello"));
  c.read_until(has_responses(1, "hello"));
  EXPECT_TRUE(c.closed_within(milliseconds(2000)));
  const auto end = steady_clock::now() + seconds(2);
  while (server_->open_connections() > 0 && steady_clock::now() < end)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(server_->open_connections(), 0u);
}

TEST_F(HttpServerTest, HttpOneZeroClosesAfterTheResponse) {
  start({});
  Client c(port_);
  c.send("GET /hello HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(c.closed_within(milliseconds(2000)));
  EXPECT_EQ(c.received().find("HTTP/1.0 200 OK"), 0u) << c.received();
}

TEST_F(HttpServerTest, StopEndsARunningStream) {
  start({});
  Client c(port_);
  c.send(get("/events"));
  c.read_until([](const std::string& s) { return s.find("data: 2") != std::string::npos; });
  const auto t0 = steady_clock::now();
  server_->stop();
  thread_.join();
  EXPECT_LT(steady_clock::now() - t0, seconds(2));
  EXPECT_TRUE(events_saw_gone_.load());
}

TEST_F(HttpServerTest, StopAcceptingClosesTheListenerAndIdleConnections) {
  start({});
  Client idle(port_);
  idle.send(get("/hello"));
  idle.read_until(has_responses(1, "hello"));
  server_->stop_accepting();
  EXPECT_TRUE(idle.closed_within(milliseconds(2000)));
  Client late(port_);
  EXPECT_FALSE(late.connected() && late.send(get("/hello")) && !late.closed_within(milliseconds(1000)));
}

}  // namespace
}  // namespace deltaflow::http
