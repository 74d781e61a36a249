#include "http/router.hpp"

#include <utility>

namespace deltaflow::http {

void Router::add(std::string method, std::string pattern, Handler handler) {
  Route r;
  r.method = std::move(method);
  if (!pattern.empty() && pattern.back() == '*') {
    pattern.pop_back();
    r.prefix = true;
  }
  r.path = std::move(pattern);
  r.handler = std::move(handler);
  routes_.push_back(std::move(r));
}

Router::Found Router::find(Request& req) const {
  const std::string method = req.method == "HEAD" ? std::string("GET") : req.method;
  Found f;
  for (const Route& r : routes_) {
    const bool path_ok =
        r.prefix ? req.path.size() > r.path.size() && req.path.starts_with(r.path) : req.path == r.path;
    if (!path_ok) continue;
    if (r.method != method) {
      f.outcome = Outcome::kNoMethod;
      continue;
    }
    req.matches = {req.path};
    if (r.prefix) req.matches.push_back(req.path.substr(r.path.size()));
    f.outcome = Outcome::kFound;
    f.handler = &r.handler;
    return f;
  }
  return f;
}

}  // namespace deltaflow::http
