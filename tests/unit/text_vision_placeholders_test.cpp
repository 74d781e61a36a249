#include <gtest/gtest.h>

#include "text/vision_placeholders.hpp"

namespace deltaflow {
namespace {

TEST(VisionPlaceholders, EachPlaceholderBecomesItsImagesTokenCount) {
  const std::vector<int32_t> ids = {1, 7, 9, 8, 2, 7, 9, 8, 3};
  auto r = text::expand_vision_placeholders(ids, 9, std::vector<int64_t>{3, 1});
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ(*r, (std::vector<int32_t>{1, 7, 9, 9, 9, 8, 2, 7, 9, 8, 3}));
}

TEST(VisionPlaceholders, CountMismatchIsAnError) {
  const std::vector<int32_t> ids = {1, 9, 2};
  EXPECT_EQ(text::expand_vision_placeholders(ids, 9, std::vector<int64_t>{2, 2}).message(),
            "the prompt has 1 image placeholders but 2 images were given");
  EXPECT_EQ(text::expand_vision_placeholders(ids, 9, {}).message(),
            "the prompt has 1 image placeholders but 0 images were given");
  EXPECT_EQ(text::expand_vision_placeholders(ids, 9, std::vector<int64_t>{0}).message(),
            "image 1 has no tokens");
  auto none = text::expand_vision_placeholders(ids, 5, {});
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(*none, ids);
}

}  // namespace
}  // namespace deltaflow
