#include "http/router.hpp"

#include <utility>

namespace deltaflow::http {

void Router::add(std::string method, std::string pattern, Handler handler) {
  Route r;
  r.method = std::move(method);
  if (pattern.find('(') == std::string::npos)
    r.exact = std::move(pattern);
  else
    r.pattern = std::regex(pattern, std::regex::ECMAScript);
  r.handler = std::move(handler);
  routes_.push_back(std::move(r));
}

Router::Found Router::find(Request& req) const {
  const std::string& method = req.method == "HEAD" ? std::string("GET") : req.method;
  Found f;
  for (const Route& r : routes_) {
    std::smatch m;
    bool path_ok;
    if (!r.exact.empty())
      path_ok = req.path == r.exact;
    else
      path_ok = std::regex_match(req.path, m, r.pattern);
    if (!path_ok) continue;
    if (r.method != method) {
      f.outcome = Outcome::kNoMethod;
      continue;
    }
    req.matches.clear();
    if (r.exact.empty())
      for (const auto& g : m) req.matches.push_back(g.str());
    else
      req.matches.push_back(req.path);
    f.outcome = Outcome::kFound;
    f.handler = &r.handler;
    return f;
  }
  return f;
}

}  // namespace deltaflow::http
