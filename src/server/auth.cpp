#include "server/auth.hpp"

#include <arpa/inet.h>

#include <cctype>
#include <string>

namespace deltaflow::server {

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Walk the longer length in full; a length mismatch is folded in, never short-circuited.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

bool bearer_matches(std::string_view v, std::string_view key) {
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  constexpr std::string_view kScheme = "bearer";
  if (v.size() < kScheme.size() + 1) return false;
  for (size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(v[i])) != kScheme[i]) return false;
  v.remove_prefix(kScheme.size());
  if (v.empty() || v.front() != ' ') return false;
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return constant_time_equal(v, key);
}

bool is_loopback_host(std::string_view host) {
  if (host == "localhost") return true;
  std::string h(host);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  in_addr a4{};
  if (inet_pton(AF_INET, h.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (inet_pton(AF_INET6, h.c_str(), &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
  return false;
}

}  // namespace deltaflow::server
