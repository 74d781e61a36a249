// Which handler answers a request: routes by method and path, a path either exact or, when it holds a group
// "(...)", a regular expression over the whole path whose groups land in Request::matches.
#pragma once

#include <functional>
#include <regex>
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
  // HEAD is answered by a GET route. Fills req.matches when found.
  Found find(Request& req) const;

 private:
  struct Route {
    std::string method;
    std::string exact;  // empty when `pattern` is used
    std::regex pattern;
    Handler handler;
  };
  std::vector<Route> routes_;
};

}  // namespace deltaflow::http
