// Base64 for image data in requests (server/base64.hpp): RFC 4648 vectors, padding optional, whitespace
// skipped, and anything else refused.
#include <gtest/gtest.h>

#include <string>

#include "server/base64.hpp"

namespace deltaflow::server {
namespace {

std::string text(const std::optional<std::vector<uint8_t>>& v) {
  return v ? std::string(v->begin(), v->end()) : std::string("<invalid>");
}

TEST(Base64, Rfc4648Vectors) {
  EXPECT_EQ(text(base64_decode("")), "");
  EXPECT_EQ(text(base64_decode("Zg==")), "f");
  EXPECT_EQ(text(base64_decode("Zm8=")), "fo");
  EXPECT_EQ(text(base64_decode("Zm9v")), "foo");
  EXPECT_EQ(text(base64_decode("Zm9vYg==")), "foob");
  EXPECT_EQ(text(base64_decode("Zm9vYmE=")), "fooba");
  EXPECT_EQ(text(base64_decode("Zm9vYmFy")), "foobar");
  EXPECT_EQ(text(base64_decode("Zm9vYg")), "foob");            // padding left out
  EXPECT_EQ(text(base64_decode("Zm9v\nYmFy\r\n")), "foobar");  // line breaks
  const auto bin = base64_decode("/+8A");
  ASSERT_TRUE(bin);
  EXPECT_EQ(*bin, (std::vector<uint8_t>{0xff, 0xef, 0x00}));
}

TEST(Base64, RefusesWhatIsNotBase64) {
  EXPECT_FALSE(base64_decode("%%%"));
  EXPECT_FALSE(base64_decode("Zm9v-YmFy"));  // the URL-safe alphabet is not this one
  EXPECT_FALSE(base64_decode("Zg==Zg=="));   // data after padding
  EXPECT_FALSE(base64_decode("Z"));          // six bits encode no byte
  EXPECT_FALSE(base64_decode("Zg==="));
}

}  // namespace
}  // namespace deltaflow::server
