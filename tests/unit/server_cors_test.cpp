// --allowed-origins parsing and the origin check behind CORS (src/server/cors.hpp).
#include <gtest/gtest.h>

#include "server/cors.hpp"

namespace deltaflow::server {
namespace {

TEST(ServerCors, ParsesOrigins) {
  auto r = parse_allowed_origins("https://a.example, http://localhost:5173/,*");
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ(*r, (std::vector<std::string>{"https://a.example", "http://localhost:5173", "*"}));
  for (const char* bad : {"", "a.example", "https://a.example/x", "ftp://a", "https://", "https://a,,"}) {
    EXPECT_FALSE(parse_allowed_origins(bad).is_ok()) << bad;
  }
  EXPECT_NE(parse_allowed_origins("https://a.example/x").message().find("'https://a.example/x'"),
            std::string::npos);
}

TEST(ServerCors, ChecksOrigins) {
  const std::vector<std::string> none, some = {"https://a.example"}, any = {"*"};
  EXPECT_EQ(check_origin(none, "", "127.0.0.1:8000"), OriginCheck::kNone);
  EXPECT_EQ(check_origin(none, "http://127.0.0.1:8000", "127.0.0.1:8000"), OriginCheck::kSameOrigin);
  EXPECT_EQ(check_origin(none, "http://localhost:8000", "127.0.0.1:8000"), OriginCheck::kRefused);
  EXPECT_EQ(check_origin(none, "https://a.example", "127.0.0.1:8000"), OriginCheck::kRefused);
  EXPECT_EQ(check_origin(some, "https://a.example", "127.0.0.1:8000"), OriginCheck::kAllowed);
  EXPECT_EQ(check_origin(some, "https://b.example", "127.0.0.1:8000"), OriginCheck::kRefused);
  EXPECT_EQ(check_origin(any, "https://b.example", "127.0.0.1:8000"), OriginCheck::kAllowed);
  EXPECT_EQ(check_origin(none, "null", ""), OriginCheck::kRefused);
}

}  // namespace
}  // namespace deltaflow::server
