// The image decoders against Pillow 13 (Image.open(f).convert("RGB"),
// tools/reference/make_vision_goldens.py): every fixture decodes to exactly Pillow's RGB bytes. Bad input
// gives an error value, never a crash.
#include <gtest/gtest.h>

#include <filesystem>

#include "../vision_goldens.hpp"
#include "vision/image_decode.hpp"

namespace deltaflow {
namespace {

using testing_vision::fixture_dir;
using testing_vision::read_bytes;
using testing_vision::VisionGoldens;

std::vector<std::string> fixture_files() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(fixture_dir() + "/images"))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(VisionDecode, EveryFixtureMatchesPillowExactly) {
  const auto& g = VisionGoldens::get();
  ASSERT_TRUE(g.ok()) << g.error;
  const auto files = fixture_files();
  ASSERT_GE(files.size(), 15u);
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const auto bytes = read_bytes(fixture_dir() + "/images/" + f);
    auto img = vision::decode_image(bytes);
    ASSERT_TRUE(img.is_ok()) << img.message();
    std::vector<int64_t> shape;
    const auto want = g.read<uint8_t>("decoded/" + f, &shape);
    ASSERT_EQ(shape.size(), 3u);
    EXPECT_EQ(img->height, shape[0]);
    EXPECT_EQ(img->width, shape[1]);
    ASSERT_EQ(img->rgb.size(), want.size());
    size_t diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff += img->rgb[i] != want[i];
    EXPECT_EQ(diff, 0u) << "bytes differing from Pillow";
  }
}

TEST(VisionDecode, SniffsTheFormat) {
  EXPECT_EQ(vision::sniff_image_format(read_bytes(fixture_dir() + "/images/rgb_67x45.png")),
            vision::ImageFormat::kPng);
  EXPECT_EQ(vision::sniff_image_format(read_bytes(fixture_dir() + "/images/photo_80x50.jpg")),
            vision::ImageFormat::kJpeg);
  EXPECT_EQ(vision::sniff_image_format(read_bytes(fixture_dir() + "/images/lossy_50x34.webp")),
            vision::ImageFormat::kWebp);
  EXPECT_EQ(vision::sniff_image_format(read_bytes(fixture_dir() + "/images/frame_gif_40x30.gif")),
            vision::ImageFormat::kGif);
  const std::string bmp = "BM\x00\x00";
  EXPECT_EQ(vision::sniff_image_format({reinterpret_cast<const uint8_t*>(bmp.data()), bmp.size()}),
            vision::ImageFormat::kUnknown);
}

TEST(VisionDecode, UnknownEmptyAndTooLargeInputAreErrors) {
  const std::string bmp = "BM this is not an image we read";
  auto r = vision::decode_image({reinterpret_cast<const uint8_t*>(bmp.data()), bmp.size()});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.message(), "unsupported image format (expected PNG, JPEG, WebP or GIF)");
  EXPECT_EQ(vision::decode_image({}).message(), "image is empty (0 bytes)");
  vision::DecodeLimits small;
  small.max_input_bytes = 100;
  const auto png = read_bytes(fixture_dir() + "/images/rgb_67x45.png");
  EXPECT_NE(vision::decode_image(png, small).message().find("more than the limit of 100"), std::string::npos);
}

TEST(VisionDecode, TruncatedFilesAreErrorsInEveryFormat) {
  for (const char* f : {"rgb_67x45.png", "photo_80x50.jpg", "progressive_48x40.jpg", "lossy_50x34.webp",
                        "anim_36x24.webp", "frame_gif_40x30.gif"}) {
    SCOPED_TRACE(f);
    auto bytes = read_bytes(fixture_dir() + "/images/" + f);
    for (size_t keep : {bytes.size() / 2, size_t{20}, size_t{12}}) {
      std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(keep));
      auto r = vision::decode_image(cut);
      // libjpeg pads a truncated scan with grey and warns: Pillow raises there too ("image file is
      // truncated"), so a truncated JPEG must be an error for us as well.
      EXPECT_FALSE(r.is_ok()) << "kept " << keep << " bytes";
      if (!r.is_ok()) {
        EXPECT_NE(r.message().find("invalid"), std::string::npos) << r.message();
      }
    }
  }
}

TEST(VisionDecode, DecompressionBombsAreRefusedBeforeDecoding) {
  // A valid PNG header claiming 60000 x 60000 (3.6 G pixels).
  auto png = read_bytes(fixture_dir() + "/images/rgb_67x45.png");
  auto put32 = [](uint8_t* p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 24);
    p[1] = static_cast<uint8_t>(v >> 16);
    p[2] = static_cast<uint8_t>(v >> 8);
    p[3] = static_cast<uint8_t>(v);
  };
  put32(png.data() + 16, 60000);
  put32(png.data() + 20, 60000);
  // Fix the IHDR CRC so that the size, not the checksum, is what fails.
  uint32_t crc = 0xffffffffu;
  for (size_t i = 12; i < 29; ++i) {
    crc ^= png[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  put32(png.data() + 29, crc ^ 0xffffffffu);
  auto r = vision::decode_image(png);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.message(),
            "PNG image is 60000x60000 (3600000000 pixels), more than the limit of 89478485 (decompression "
            "bomb protection)");
  // The same limit for every format, through DecodeLimits.
  vision::DecodeLimits tight;
  tight.max_pixels = 1000;
  for (const char* f : {"photo_80x50.jpg", "lossy_50x34.webp", "frame_gif_40x30.gif"}) {
    auto e = vision::decode_image(read_bytes(fixture_dir() + "/images/" + f), tight);
    ASSERT_FALSE(e.is_ok()) << f;
    EXPECT_NE(e.message().find("more than the limit of 1000"), std::string::npos) << e.message();
  }
  tight = {};
  tight.max_side = 40;
  auto e = vision::decode_image(read_bytes(fixture_dir() + "/images/photo_80x50.jpg"), tight);
  EXPECT_EQ(e.message(), "JPEG image is 80x50, larger than the limit of 40 pixels a side");
}

TEST(VisionDecode, CorruptDataIsAnError) {
  auto bytes = read_bytes(fixture_dir() + "/images/rgb_67x45.png");
  for (size_t i = 40; i < bytes.size() - 20; i += 7) bytes[i] ^= 0x5a;
  auto r = vision::decode_image(bytes);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.message().rfind("invalid PNG: ", 0), 0u) << r.message();
}

}  // namespace
}  // namespace deltaflow
