#include "http/request_parse.hpp"

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>

namespace deltaflow::http {

namespace bhttp = boost::beast::http;

void apply_limits(RequestParser& parser, const ParseLimits& limits) {
  parser.header_limit(static_cast<uint32_t>(limits.max_header_bytes));
  parser.body_limit(static_cast<uint64_t>(limits.max_body_bytes));
}

Request request_from(bhttp::request<bhttp::string_body>& msg) {
  Request req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  const size_t q = req.target.find('?');
  req.path = percent_decode(std::string_view(req.target).substr(0, q));
  if (q != std::string::npos) req.query = req.target.substr(q + 1);
  req.version = static_cast<int>(msg.version());
  for (const auto& f : msg) req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  req.body = std::move(msg.body());
  return req;
}

ParseFailure parse_failure(const boost::system::error_code& ec, const ParseLimits& limits) {
  if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message) return {};
  if (ec == bhttp::error::body_limit)
    return {413, "the request body is larger than the limit of " + std::to_string(limits.max_body_bytes) +
                     " bytes"};
  if (ec == bhttp::error::header_limit)
    return {431, "the request head is larger than " + std::to_string(limits.max_header_bytes) + " bytes"};
  return {400, "malformed HTTP request: " + ec.message()};
}

ParsedBytes parse_requests(std::string_view bytes, const ParseLimits& limits) {
  ParsedBytes out;
  while (!bytes.empty()) {
    RequestParser parser;
    apply_limits(parser, limits);
    parser.eager(true);
    boost::system::error_code ec;
    size_t used = 0;
    while (!parser.is_done() && used < bytes.size()) {
      const size_t n = parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
      if (ec == bhttp::error::need_more) {
        ec = {};
        used = bytes.size();  // everything was looked at: the rest of the request has not come
        break;
      }
      if (ec) break;
      if (n == 0) break;
      used += n;
    }
    if (ec) {
      out.failure = parse_failure(ec, limits);
      return out;
    }
    if (!parser.is_done()) {
      out.partial = true;
      return out;
    }
    out.requests.push_back(request_from(parser.get()));
    bytes.remove_prefix(used);
  }
  return out;
}

}  // namespace deltaflow::http
