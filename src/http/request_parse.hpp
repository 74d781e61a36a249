// Bytes to requests as the server reads them: Beast's parser with the server's limits, a parsed message to
// a Request (path percent-decoded, query split off), and a parse error to the status the server answers.
// server.cpp reads sockets with it; the fuzz target (tests/fuzz/fuzz_http_request.cpp) feeds it bytes.
#pragma once

// Boost 1.74's Asio and Beast use std::exchange without including <utility> (an error with GCC 12).
#include <utility>

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/system/error_code.hpp>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "http/message.hpp"

namespace deltaflow::http {

struct ParseLimits {
  size_t max_header_bytes = 64u << 10;
  size_t max_body_bytes = 8u << 20;
};

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// Sets the limits on a parser (Beast's defaults are 8 KiB of head and 1 MiB of body).
void apply_limits(RequestParser& parser, const ParseLimits& limits);

// The Request a parsed message is (its body moved out).
Request request_from(boost::beast::http::request<boost::beast::http::string_body>& msg);

// The answer to a parse error: 400 malformed, 413 body over the limit, 431 head over the limit; 0 when the
// client merely went away (end of stream, a message cut short): close without answering.
struct ParseFailure {
  int status = 0;
  std::string message;
};
ParseFailure parse_failure(const boost::system::error_code& ec, const ParseLimits& limits);

// Every complete request in `bytes`, in order, then the failure that stopped parsing (status 0 when the
// bytes merely ended); `partial` is whether bytes of an unfinished request are left.
struct ParsedBytes {
  std::vector<Request> requests;
  ParseFailure failure;
  bool partial = false;
};
ParsedBytes parse_requests(std::string_view bytes, const ParseLimits& limits);

}  // namespace deltaflow::http
