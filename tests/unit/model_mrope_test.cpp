// Multimodal rotary positions against transformers 5.17 Qwen3_5Model.get_rope_index
// (tools/reference/make_vision_goldens.py), and the interleaved frequency assignment.
#include <gtest/gtest.h>

#include "../vision_goldens.hpp"
#include "model/mrope.hpp"

namespace deltaflow {
namespace {

using testing_vision::VisionGoldens;

constexpr int64_t kImage = 1010, kVideo = 1011;  // the tiny tokenizer's <|image_pad|>, <|video_pad|>

model::VisionGrid grid_of(const std::string& name) {
  const auto g = VisionGoldens::get().read<int64_t>("grid/" + name);
  return g.size() == 3 ? model::VisionGrid{g[0], g[1], g[2]} : model::VisionGrid{};
}

TEST(Mrope, MatchesGetRopeIndex) {
  const auto& g = VisionGoldens::get();
  ASSERT_TRUE(g.ok()) << g.error;
  const std::vector<std::pair<std::string, std::vector<std::string>>> prompts = {
      {"text", {}}, {"one", {"rgb_67x45.png"}}, {"two", {"photo_80x50.jpg", "synth_100x150"}}};
  for (const auto& [name, images] : prompts) {
    SCOPED_TRACE(name);
    const auto ids = g.read<int32_t>("mrope/" + name + "/ids");
    const auto want = g.read<int64_t>("mrope/" + name + "/positions");
    const auto delta = g.read<int64_t>("mrope/" + name + "/delta");
    std::vector<model::VisionGrid> grids;
    for (const auto& im : images) grids.push_back(grid_of(im));
    auto p = model::mrope_positions(ids, kImage, kVideo, grids, {}, 2);
    ASSERT_TRUE(p.is_ok()) << p.message();
    const size_t n = ids.size();
    ASSERT_EQ(want.size(), 3 * n);
    EXPECT_EQ(p->t, std::vector<int64_t>(want.begin(), want.begin() + n));
    EXPECT_EQ(p->h, std::vector<int64_t>(want.begin() + n, want.begin() + 2 * n));
    EXPECT_EQ(p->w, std::vector<int64_t>(want.begin() + 2 * n, want.end()));
    ASSERT_EQ(delta.size(), 1u);
    EXPECT_EQ(p->rope_delta, delta[0]);
  }
}

TEST(Mrope, PlaceholderAndGridMismatchesAreErrors) {
  const std::vector<int32_t> ids = {1, 1007, 1010, 1010, 1010, 1008, 2};
  const model::VisionGrid g{1, 4, 4};  // needs 4 tokens
  EXPECT_EQ(model::mrope_positions(ids, kImage, kVideo, std::vector{g}, {}, 2).message(),
            "mrope: image 1 has 3 placeholder tokens, its grid needs 4");
  EXPECT_EQ(model::mrope_positions(ids, kImage, kVideo, {}, {}, 2).message(),
            "mrope: more image placeholder runs than images (0)");
  const std::vector<int32_t> text = {1, 2, 3};
  EXPECT_EQ(model::mrope_positions(text, kImage, kVideo, std::vector{g}, {}, 2).message(),
            "mrope: 1 images but 0 image placeholder runs");
}

TEST(Mrope, VideoFramesEachTakeOneRun) {
  // A 2-frame video is split into two one-frame grids; each frame run is framed by text in between.
  const std::vector<int32_t> ids = {5, kVideo, kVideo, 6, kVideo, kVideo, 7};
  const model::VisionGrid v{2, 2, 4};  // per frame 1 x 2 merged tokens
  auto p = model::mrope_positions(ids, kImage, kVideo, {}, std::vector{v}, 2);
  ASSERT_TRUE(p.is_ok()) << p.message();
  EXPECT_EQ(p->t, (std::vector<int64_t>{0, 1, 1, 3, 4, 4, 6}));
  EXPECT_EQ(p->h, (std::vector<int64_t>{0, 1, 1, 3, 4, 4, 6}));
  EXPECT_EQ(p->w, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p->rope_delta, 0);
}

TEST(Mrope, InterleavedAxisAssignment) {
  // Qwen3.5: mrope_section [11, 11, 10] over 32 frequencies.
  const std::vector<int64_t> s = {11, 11, 10};
  std::string axes;
  for (int i = 0; i < 32; ++i) axes += "thw"[model::mrope_axis(i, s, true)];
  EXPECT_EQ(axes, "thwthwthwthwthwthwthwthwthwthwth");  // i = 31: 31 % 3 == 1 and 31 < 33
  // The tiny presets: [3, 3, 2] over 8.
  const std::vector<int64_t> tiny = {3, 3, 2};
  axes.clear();
  for (int i = 0; i < 8; ++i) axes += "thw"[model::mrope_axis(i, tiny, true)];
  EXPECT_EQ(axes, "thwthwth");
  axes.clear();
  for (int i = 0; i < 8; ++i) axes += "thw"[model::mrope_axis(i, tiny, false)];
  EXPECT_EQ(axes, "ttthhhww");
}

}  // namespace
}  // namespace deltaflow
