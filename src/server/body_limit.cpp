#include "server/body_limit.hpp"

#include <utility>

namespace deltaflow::server {

void post_limited(httplib::Server& svr, const ServerContext& ctx, bool ollama, const std::string& path,
                  httplib::Server::Handler handler) {
  svr.Post(path,
           [&ctx, ollama, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                                        const httplib::ContentReader& reader) {
             const size_t limit = ctx.options.max_body_bytes;
             std::string body;
             bool over = false;
             const bool read = reader([&](const char* data, size_t n) {
               if (body.size() + n > limit) {
                 over = true;
                 return false;
               }
               body.append(data, n);
               return true;
             });
             // httplib refuses a Content-Length over the limit itself, leaving status 413.
             if (over || res.status == 413) {
               res.set_header("Connection", "close");  // the rest of the body is not read
               return send_error(res, too_large(limit), ollama);
             }
             if (!read) {
               res.set_header("Connection", "close");
               return send_error(res,
                                 ApiError{400, "the request body could not be read (bad chunked encoding?)",
                                          "invalid_request_error", "", ""},
                                 ollama);
             }
             httplib::Request with_body = req;
             with_body.body = std::move(body);
             handler(with_body, res);
           });
}

}  // namespace deltaflow::server
