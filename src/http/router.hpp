// Which handler answers a request: routes by method and path, a path either exact or a prefix ending in '*'
// ("/v1/models/*"), whose non-empty rest lands in Request::matches[1]. No regular expressions: libstdc++'s
// std::regex recurses once per character, and a 30 KB path overflowed a handler thread's stack.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "http/message.hpp"

namespace deltaflow::http {

using Handler = std::function<void(const Request&, Response&)>;

class Router {
 public:
  void add(std::string method, std::string pattern, Handler handler);

  enum class Outcome { kFound, kNoPath, kNoMethod };
  struct Found {
    Outcome outcome = Outcome::kNoPath;
    const Handler* handler = nullptr;
  };
  // HEAD is answered by a GET route. Fills req.matches when found: [0] the path, [1] a prefix route's rest.
  Found find(Request& req) const;

 private:
  struct Route {
    std::string method;
    std::string path;  // exact, or the prefix when `prefix`
    bool prefix = false;
    Handler handler;
  };
  std::vector<Route> routes_;
};

}  // namespace deltaflow::http
