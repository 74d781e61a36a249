// API-key comparison, bearer parsing and the loopback rule.
#include <gtest/gtest.h>

#include "server/auth.hpp"

namespace deltaflow::server {
namespace {

TEST(ServerAuth, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_TRUE(constant_time_equal("sk-abc", "sk-abc"));
  EXPECT_FALSE(constant_time_equal("sk-abc", "sk-abd"));
  EXPECT_FALSE(constant_time_equal("sk-abc", "sk-ab"));
  EXPECT_FALSE(constant_time_equal("sk-ab", "sk-abc"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  // A prefix padded with NULs must not pass for the key.
  EXPECT_FALSE(constant_time_equal(std::string("ab\0", 3), "ab"));
}

TEST(ServerAuth, BearerHeader) {
  EXPECT_TRUE(bearer_matches("Bearer k1", "k1"));
  EXPECT_TRUE(bearer_matches("bearer k1", "k1"));
  EXPECT_TRUE(bearer_matches("  Bearer   k1  ", "k1"));
  EXPECT_FALSE(bearer_matches("Bearer k2", "k1"));
  EXPECT_FALSE(bearer_matches("Basic k1", "k1"));
  EXPECT_FALSE(bearer_matches("Bearerk1", "k1"));
  EXPECT_FALSE(bearer_matches("k1", "k1"));
  EXPECT_FALSE(bearer_matches("", "k1"));
  EXPECT_FALSE(bearer_matches("Bearer ", "k1"));
}

TEST(ServerAuth, Loopback) {
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.1.2.3"));
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_TRUE(is_loopback_host("[::1]"));
  EXPECT_FALSE(is_loopback_host("0.0.0.0"));
  EXPECT_FALSE(is_loopback_host("::"));
  EXPECT_FALSE(is_loopback_host("192.168.1.5"));
  EXPECT_FALSE(is_loopback_host("example.com"));
  EXPECT_FALSE(is_loopback_host(""));
}

}  // namespace
}  // namespace deltaflow::server
