#include "http/message.hpp"

#include <strings.h>

#include <cstdio>

namespace deltaflow::http {

std::string_view find_header(const Headers& headers, std::string_view name) {
  for (const auto& [k, v] : headers)
    if (k.size() == name.size() && strncasecmp(k.data(), name.data(), k.size()) == 0) return v;
  return {};
}

void Response::set_header(std::string name, std::string value) {
  for (auto& [k, v] : headers)
    if (k.size() == name.size() && strncasecmp(k.data(), name.data(), k.size()) == 0) {
      v = std::move(value);
      return;
    }
  headers.emplace_back(std::move(name), std::move(value));
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string serialize_head(const Response& res, int version, bool keep_alive, size_t content_length,
                           bool chunked) {
  std::string out = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  out += std::to_string(res.status);
  out += ' ';
  out += reason_phrase(res.status);
  out += "\r\n";
  for (const auto& [k, v] : res.headers) {
    // The framing headers are ours to write.
    if (strcasecmp(k.c_str(), "Content-Length") == 0 || strcasecmp(k.c_str(), "Transfer-Encoding") == 0 ||
        strcasecmp(k.c_str(), "Connection") == 0)
      continue;
    out += k;
    out += ": ";
    out += v;
    out += "\r\n";
  }
  if (!res.content_type.empty() && find_header(res.headers, "Content-Type").empty())
    out += "Content-Type: " + res.content_type + "\r\n";
  if (chunked)
    out += "Transfer-Encoding: chunked\r\n";
  else if (res.status >= 200 && res.status != 204 && res.status != 304)
    out += "Content-Length: " + std::to_string(content_length) + "\r\n";
  if (!keep_alive)
    out += "Connection: close\r\n";
  else if (version == 10)
    out += "Connection: keep-alive\r\n";
  out += "\r\n";
  return out;
}

std::string percent_decode(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

}  // namespace deltaflow::http
