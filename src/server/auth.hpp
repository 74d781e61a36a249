// API-key checks: the key is compared in time independent of where the first difference lies, and a server
// reachable from other machines refuses to start without one.
#pragma once

#include <string>
#include <string_view>

namespace deltaflow::server {

// Equal strings; the running time depends only on the lengths, not on the contents.
bool constant_time_equal(std::string_view a, std::string_view b);

// Whether an `Authorization` header value carries the key as a bearer token ("Bearer <key>").
bool bearer_matches(std::string_view header_value, std::string_view key);

// 127.0.0.0/8, ::1 and "localhost": only this machine can connect.
bool is_loopback_host(std::string_view host);

}  // namespace deltaflow::server
