// Bytes to requests (http/request_parse.hpp), as the server and the fuzz target read them.
#include <gtest/gtest.h>

#include "http/request_parse.hpp"
#include "http/router.hpp"

namespace deltaflow::http {
namespace {

TEST(HttpRequestParse, PipelinedRequestsComeOutInOrderWithDecodedPaths) {
  const auto p = parse_requests(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
      "GET /v1/models/a%2Fb?x=1 HTTP/1.1\r\nhost: y\r\n\r\n"
      "GET /par",
      {});
  ASSERT_EQ(p.requests.size(), 2u);
  EXPECT_EQ(p.requests[0].method, "POST");
  EXPECT_EQ(p.requests[0].body, "hello");
  EXPECT_EQ(p.requests[1].path, "/v1/models/a/b");
  EXPECT_EQ(p.requests[1].query, "x=1");
  EXPECT_EQ(p.requests[1].header("Host"), "y");  // names match case-insensitively
  EXPECT_TRUE(p.partial);
  EXPECT_EQ(p.failure.status, 0);
}

TEST(HttpRequestParse, ChunkedBodiesAreJoinedAndLimitsHold) {
  auto p = parse_requests(
      "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n", {});
  ASSERT_EQ(p.requests.size(), 1u);
  EXPECT_EQ(p.requests[0].body, "helloabc");
  ParseLimits small;
  small.max_body_bytes = 4;
  p = parse_requests("POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", small);
  EXPECT_EQ(p.failure.status, 413);
  p = parse_requests("POST /a HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", {});
  EXPECT_EQ(p.failure.status, 400);
  p = parse_requests("POST /a HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", small);
  EXPECT_EQ(p.failure.status, 413);
  small.max_header_bytes = 64;
  p = parse_requests("GET /a HTTP/1.1\r\nX: " + std::string(100, 'x') + "\r\n\r\n", small);
  EXPECT_EQ(p.failure.status, 431);
  p = parse_requests("GARBAGE\r\n\r\n", {});
  EXPECT_EQ(p.failure.status, 400);
  EXPECT_NE(p.failure.message.find("malformed"), std::string::npos);
}

TEST(HttpRouter, ExactAndPrefixRoutesAndMethods) {
  Router r;
  int hit = 0;
  r.add("GET", "/v1/models", [&](const Request&, Response&) { hit = 1; });
  r.add("GET", "/v1/models/*", [&](const Request&, Response&) { hit = 2; });
  Request q;
  q.method = "GET";
  q.path = "/v1/models/Qwen/Qwen3.5-27B";
  auto f = r.find(q);
  ASSERT_EQ(f.outcome, Router::Outcome::kFound);
  Response res;
  (*f.handler)(q, res);
  EXPECT_EQ(hit, 2);
  ASSERT_EQ(q.matches.size(), 2u);
  EXPECT_EQ(q.matches[1], "Qwen/Qwen3.5-27B");
  q.path = "/v1/models/";  // a prefix route needs a non-empty rest
  EXPECT_EQ(r.find(q).outcome, Router::Outcome::kNoPath);
  q.path = "/v1/models";
  q.method = "HEAD";
  EXPECT_EQ(r.find(q).outcome, Router::Outcome::kFound);
  q.method = "POST";
  EXPECT_EQ(r.find(q).outcome, Router::Outcome::kNoMethod);
}

TEST(HttpMessage, PercentDecodeLeavesBadEscapes) {
  EXPECT_EQ(percent_decode("a%2Fb%zz%4"), "a/b%zz%4");
  EXPECT_EQ(percent_decode("%"), "%");
}

}  // namespace
}  // namespace deltaflow::http
