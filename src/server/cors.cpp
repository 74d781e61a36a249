#include "server/cors.hpp"

#include <algorithm>
#include <cctype>

namespace deltaflow::server {

namespace {

bool valid_origin(const std::string& o) {
  if (o == "*") return true;
  size_t rest;
  if (o.rfind("http://", 0) == 0)
    rest = 7;
  else if (o.rfind("https://", 0) == 0)
    rest = 8;
  else
    return false;
  if (rest >= o.size()) return false;
  for (size_t i = rest; i < o.size(); ++i) {
    const char c = o[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' || c == '[' ||
          c == ']'))
      return false;
  }
  return true;
}

}  // namespace

core::Expected<std::vector<std::string>> parse_allowed_origins(const std::string& list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    std::string item = list.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty() && item.back() == '/') item.pop_back();
    if (item.empty()) return core::Error{"an empty entry in '" + list + "'"};
    if (!valid_origin(item))
      return core::Error{"'" + item + "' is not an origin (scheme://host[:port], or *)"};
    out.push_back(item);
    pos = comma + 1;
  }
  return out;
}

OriginCheck check_origin(const std::vector<std::string>& allowed, const std::string& origin,
                         const std::string& host) {
  if (origin.empty()) return OriginCheck::kNone;
  if (std::find(allowed.begin(), allowed.end(), "*") != allowed.end() ||
      std::find(allowed.begin(), allowed.end(), origin) != allowed.end())
    return OriginCheck::kAllowed;
  if (!host.empty() && (origin == "http://" + host || origin == "https://" + host))
    return OriginCheck::kSameOrigin;
  return OriginCheck::kRefused;
}

}  // namespace deltaflow::server
