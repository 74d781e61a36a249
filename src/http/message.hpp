// What a handler sees and fills: one parsed HTTP/1.1 request and its response. A response is either whole
// (status, headers, body) or streamed: a function that writes chunks as they come, on the handler's thread.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deltaflow::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

// The value of the first header named `name` (case-insensitive), or "" when there is none.
std::string_view find_header(const Headers& headers, std::string_view name);

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: "/v1/models?x=1"
  std::string path;    // the target's path, percent-decoded, without the query
  std::string query;   // after '?', as sent
  int version = 11;    // 10 or 11
  Headers headers;
  std::string body;
  std::vector<std::string> matches;  // the route's regex groups; [0] is the whole path
  std::string remote;                // "127.0.0.1:51234"

  std::string header(std::string_view name) const { return std::string(find_header(headers, name)); }
};

// Where a streamed response's chunks go. write() queues the bytes for the client; false once the client is
// gone or has not taken what it was sent within the write timeout: the producer should stop then.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  virtual bool write(std::string_view data) = 0;
  // Whether the client is known to be gone (closed its connection), without writing.
  virtual bool gone() const = 0;
};

struct Response {
  using Producer = std::function<void(ChunkSink&)>;

  int status = 200;
  Headers headers;
  std::string body;
  std::string content_type;
  Producer producer;  // set: the body is streamed (chunked); `body` is unused

  void set_header(std::string name, std::string value);
  std::string header(std::string_view name) const { return std::string(find_header(headers, name)); }
  void set_content(std::string text, std::string type) {
    body = std::move(text);
    content_type = std::move(type);
  }
  // The body comes from `produce`, which runs once on the handler's thread after the headers have gone out
  // and returns when the body is complete (or the client is gone).
  void stream(std::string type, Producer produce) {
    content_type = std::move(type);
    producer = std::move(produce);
  }
};

// "OK", "Not Found", ... ("Unknown" for codes not listed).
const char* reason_phrase(int status);

// The bytes of a whole response's head: status line, headers, Content-Type, Content-Length or
// Transfer-Encoding: chunked, Connection. `keep_alive` false adds "Connection: close".
std::string serialize_head(const Response& res, int version, bool keep_alive, size_t content_length,
                           bool chunked);

// "%2F" -> "/"; a malformed escape stays as it is.
std::string percent_decode(std::string_view s);

}  // namespace deltaflow::http
