// The image processor against transformers 5.17's Qwen2VLImageProcessor (torchvision backend, CPU):
// smart_resize sizes, the uint8 image after the bicubic antialiased resize, and pixel values, all exact.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../vision_goldens.hpp"
#include "model/tiny_checkpoint.hpp"
#include "vision/image_decode.hpp"
#include "vision/preprocess.hpp"
#include "vision/processor_config.hpp"
#include "vision/resize.hpp"

namespace deltaflow {
namespace {

using testing_vision::fixture_dir;
using testing_vision::read_bytes;
using testing_vision::VisionGoldens;

// The make-tiny vl preset's preprocessor_config.json, as the goldens' processor read it.
vision::ProcessorConfig tiny_processor() {
  const auto dir =
      (std::filesystem::temp_directory_path() / ("df_vision_pp_" + std::to_string(::getpid()))).string();
  EXPECT_TRUE(model::write_tiny_checkpoint("vl", 1, dir).is_ok());
  auto c = vision::load_processor_config(dir);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(c.is_ok()) << c.message();
  return c.is_ok() ? *c : vision::ProcessorConfig{};
}

vision::Image case_image(const std::string& name) {
  if (name.rfind("synth_", 0) == 0) {
    const auto x = name.find('x');
    const int64_t h = std::stoll(name.substr(6, x - 6)), w = std::stoll(name.substr(x + 1));
    return vision::Image{w, h, testing_vision::synthetic_rgb(h, w)};
  }
  auto img = vision::decode_image(read_bytes(fixture_dir() + "/images/" + name));
  EXPECT_TRUE(img.is_ok()) << img.message();
  return img.is_ok() ? *img : vision::Image{};
}

TEST(VisionPreprocess, SmartResizeMatchesTransformers) {
  const auto& g = VisionGoldens::get();
  ASSERT_TRUE(g.ok()) << g.error;
  std::vector<int64_t> shape;
  const auto rows = g.read<int64_t>("smart_resize", &shape);
  ASSERT_EQ(shape.size(), 2u);
  ASSERT_EQ(shape[1], 7);
  for (int64_t r = 0; r < shape[0]; ++r) {
    const int64_t* v = rows.data() + r * 7;
    auto s = vision::smart_resize(v[0], v[1], v[2], v[3], v[4]);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_EQ(s->height, v[5]) << v[0] << "x" << v[1] << " factor " << v[2] << " [" << v[3] << ", " << v[4]
                               << "]";
    EXPECT_EQ(s->width, v[6]) << v[0] << "x" << v[1] << " factor " << v[2] << " [" << v[3] << ", " << v[4]
                              << "]";
  }
  EXPECT_EQ(vision::smart_resize(10, 2001, 32, 4096, 65536).message(),
            "image aspect ratio must be at most 200, got 2001x10");
}

TEST(VisionPreprocess, ResizeAndPixelValuesMatchTransformersExactly) {
  const auto& g = VisionGoldens::get();
  ASSERT_TRUE(g.ok()) << g.error;
  const auto cfg = tiny_processor();
  int checked_pixels = 0;
  for (const char* name : {"rgb_67x45.png", "photo_80x50.jpg", "lossy_50x34.webp", "gray_31x17.jpg",
                           "synth_300x400", "synth_100x150", "synth_37x1000", "synth_64x64"}) {
    SCOPED_TRACE(name);
    const auto img = case_image(name);
    vision::Image resized;
    auto pv = vision::preprocess_image(img, cfg, &resized);
    ASSERT_TRUE(pv.is_ok()) << pv.message();
    std::vector<int64_t> shape;
    const auto want = g.read<uint8_t>(std::string("resized/") + name, &shape);
    ASSERT_EQ(shape.size(), 3u);
    EXPECT_EQ(resized.height, shape[0]);
    EXPECT_EQ(resized.width, shape[1]);
    ASSERT_EQ(resized.rgb.size(), want.size());
    size_t diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff += resized.rgb[i] != want[i];
    EXPECT_EQ(diff, 0u) << "resized bytes differing from torchvision";
    const auto grid = g.read<int64_t>(std::string("grid/") + name);
    ASSERT_EQ(grid.size(), 3u);
    EXPECT_EQ(pv->grid_t, grid[0]);
    EXPECT_EQ(pv->grid_h, grid[1]);
    EXPECT_EQ(pv->grid_w, grid[2]);
    EXPECT_EQ(pv->patch_dim, 1536);
    EXPECT_EQ(vision::image_token_count(*pv, cfg.merge_size), grid[0] * grid[1] * grid[2] / 4);
    if (g.find(std::string("pixels/") + name)) {
      const auto px = g.read<float>(std::string("pixels/") + name);
      ASSERT_EQ(px.size(), pv->data.size());
      size_t bad = 0;
      for (size_t i = 0; i < px.size(); ++i) bad += px[i] != pv->data[i];
      EXPECT_EQ(bad, 0u) << "pixel values differing (exact fp32 expected)";
      ++checked_pixels;
    }
  }
  EXPECT_EQ(checked_pixels, 2);
}

TEST(VisionPreprocess, ProcessorConfigFieldsAndErrors) {
  auto c = vision::parse_processor_config(
      R"({"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
          "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
          "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"})",
      "p.json");
  ASSERT_TRUE(c.is_ok()) << c.message();
  EXPECT_EQ(c->min_pixels, 65536);
  EXPECT_EQ(c->max_pixels, 16777216);
  EXPECT_EQ(c->factor(), 32);
  EXPECT_EQ(c->image_mean[1], 0.5f);
  // The legacy keys override size, as Qwen2VLImageProcessor.__init__ does.
  auto legacy = vision::parse_processor_config(R"({"min_pixels": 100, "max_pixels": 2000})", "p.json");
  ASSERT_TRUE(legacy.is_ok());
  EXPECT_EQ(legacy->min_pixels, 100);
  EXPECT_EQ(legacy->max_pixels, 2000);
  EXPECT_EQ(vision::parse_processor_config(R"({"resample": 2})", "p.json").message(),
            "p.json: field 'resample' must be 3 (bicubic); other filters are not supported");
  EXPECT_EQ(vision::parse_processor_config(R"({"patch_size": -1})", "p.json").message(),
            "p.json: field 'patch_size' must be a positive integer");
  EXPECT_EQ(vision::parse_processor_config(R"({"size": {"shortest_edge": 10, "longest_edge": 5}})", "p.json")
                .message(),
            "p.json: min pixels 10 exceed max pixels 5");
  EXPECT_EQ(vision::parse_processor_config(R"({"image_std": [1, 0, 1]})", "p.json").message(),
            "p.json: field 'image_std' must not contain 0");
  EXPECT_NE(vision::load_processor_config("/nonexistent").message().find("cannot open"), std::string::npos);
}

TEST(VisionPreprocess, AMaxPixelsCapShrinksTheGrid) {
  auto cfg = tiny_processor();
  const auto img = case_image("synth_300x400");
  auto full = vision::preprocess_image(img, cfg);
  ASSERT_TRUE(full.is_ok());
  cfg.max_pixels = 128 * 128;  // a per-request cap (--max-image-pixels) lowers the processor's max
  auto capped = vision::preprocess_image(img, cfg);
  ASSERT_TRUE(capped.is_ok());
  EXPECT_LE(capped->grid_h * capped->grid_w * 16 * 16, 128 * 128);
  EXPECT_LT(capped->rows, full->rows);
}

TEST(VisionResize, SameSizeIsACopyAndOneAxisOnlyFiltersThatAxis) {
  const auto img = case_image("synth_64x64");
  const auto same = vision::resize_bicubic_antialias(img, 64, 64);
  EXPECT_EQ(same.rgb, img.rgb);
  const auto narrow = vision::resize_bicubic_antialias(img, 32, 64);
  EXPECT_EQ(narrow.width, 32);
  EXPECT_EQ(narrow.height, 64);
  // A flat image stays flat whatever the scale (weights are normalised).
  vision::Image flat{17, 9, std::vector<uint8_t>(17 * 9 * 3, 77)};
  for (auto [w, h] : {std::pair{5, 3}, {64, 32}, {17, 40}}) {
    const auto r = vision::resize_bicubic_antialias(flat, w, h);
    for (uint8_t v : r.rgb) ASSERT_EQ(v, 77);
  }
}

}  // namespace
}  // namespace deltaflow
