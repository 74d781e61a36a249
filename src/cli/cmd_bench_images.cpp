// `deltaflow bench --images N [--image-size HxW] [--model DIR] [--device D] [--json]`: the vision encoder's
// speed on the backend that serves the model. One synthetic RGB image of the given size goes through the
// checkpoint's image processor (timed: preprocess ms), then the encoder alone (batch 1, median of 5), then N
// copies of it in one encode_images call: images per second and the tokens each image gives the language
// model.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/model_options.hpp"
#include "model/mrope.hpp"
#include "vision/preprocess.hpp"
#include "vision/processor_config.hpp"

namespace deltaflow::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A smooth colour field with some texture: what the encoder computes does not depend on the values.
vision::Image synthetic_image(int64_t h, int64_t w) {
  vision::Image im{w, h, std::vector<uint8_t>(static_cast<size_t>(h * w * 3))};
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t c = 0; c < 3; ++c)
        im.rgb[static_cast<size_t>((y * w + x) * 3 + c)] =
            static_cast<uint8_t>((x * (c + 1) + y * (3 - c) + ((x ^ y) & 15)) & 255);
  return im;
}

}  // namespace

int cmd_bench_images(const Argv& argv) {
  const std::string cmd = "bench";
  ArgSpec spec{{"--images", "--image-size", "--model", "--device"}, {"--json"}, 0};
  auto args = Args::parse(argv, spec);
  if (!args) return fail(cmd, args.message());
  auto n = args->get_int("--images", 16);
  if (!n) return fail(cmd, n.message());
  if (*n < 1 || *n > 1024) return fail(cmd, "flag --images must be in [1, 1024]");
  const std::string size = args->get_or("--image-size", "1024x1024");
  int64_t h = 0, w = 0;
  {
    const size_t x = size.find('x');
    try {
      if (x == std::string::npos) throw std::invalid_argument("no x");
      size_t used = 0;
      h = std::stoll(size.substr(0, x), &used);
      if (used != x) throw std::invalid_argument("height");
      w = std::stoll(size.substr(x + 1), &used);
      if (used != size.size() - x - 1) throw std::invalid_argument("width");
    } catch (const std::exception&) {
      return fail(cmd,
                  "flag --image-size must be HEIGHTxWIDTH in pixels, e.g. 1024x1024, not '" + size + "'");
    }
    if (h < 1 || w < 1 || h > 16384 || w > 16384)
      return fail(cmd, "flag --image-size: each side must be in [1, 16384]");
  }
  const std::string dir = model_dir(*args);
  auto backend = open_backend(*args);
  if (!backend) return fail(cmd, backend.message());
  backend::Backend& b = **backend;
  if (!b.vision()) return fail(cmd, b.vision_error());
  auto pc = vision::load_processor_config(dir);
  if (!pc) return fail(cmd, pc.message());

  const vision::Image image = synthetic_image(h, w);
  auto t0 = Clock::now();
  auto pv = vision::preprocess_image(image, *pc);
  const double preprocess_s = seconds_since(t0);
  if (!pv) return fail(cmd, pv.message());
  const model::VisionGrid grid{pv->grid_t, pv->grid_h, pv->grid_w};
  const int64_t tokens = vision::image_token_count(*pv, b.vision()->spatial_merge_size);

  // Batch 1: the first call warms up, then the median of 5.
  std::vector<double> one;
  for (int i = 0; i < 6; ++i) {
    t0 = Clock::now();
    auto e = b.encode_images(pv->data, std::span<const model::VisionGrid>(&grid, 1));
    if (!e) return fail(cmd, e.message());
    if (i > 0) one.push_back(seconds_since(t0));
  }
  std::sort(one.begin(), one.end());
  const double one_s = one[one.size() / 2];
  // N images in one call.
  std::vector<float> pixels;
  pixels.reserve(pv->data.size() * static_cast<size_t>(*n));
  for (int64_t i = 0; i < *n; ++i) pixels.insert(pixels.end(), pv->data.begin(), pv->data.end());
  const std::vector<model::VisionGrid> grids(static_cast<size_t>(*n), grid);
  t0 = Clock::now();
  auto e = b.encode_images(pixels, grids);
  const double batch_s = seconds_since(t0);
  if (!e) return fail(cmd, e.message());

  const double ips = static_cast<double>(*n) / batch_s;
  if (args->has("--json")) {
    nlohmann::ordered_json j = {{"model", dir},
                                {"backend", b.name()},
                                {"image_size", {h, w}},
                                {"grid_thw", {grid.t, grid.h, grid.w}},
                                {"tokens_per_image", tokens},
                                {"preprocess_ms", preprocess_s * 1e3},
                                {"encode_one_ms", one_s * 1e3},
                                {"images", *n},
                                {"encode_batch_s", batch_s},
                                {"images_per_second", ips}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model       %s (%s backend)\n", dir.c_str(), b.name());
  std::printf("image       %lldx%lld -> grid %lldx%lldx%lld patches, %lld tokens\n",
              static_cast<long long>(h), static_cast<long long>(w), static_cast<long long>(grid.t),
              static_cast<long long>(grid.h), static_cast<long long>(grid.w), static_cast<long long>(tokens));
  std::printf("preprocess %9.2f ms (decode not counted: the image is made in memory)\n", preprocess_s * 1e3);
  std::printf("encode 1   %9.2f ms (median of 5)\n", one_s * 1e3);
  std::printf("encode %-3lld %9.3f s   %.2f images/s\n", static_cast<long long>(*n), batch_s, ips);
  return 0;
}

}  // namespace deltaflow::cli
