#include "engine/image_prompt.hpp"

#include <algorithm>
#include <cstring>

namespace deltaflow::engine {

uint64_t image_content_hash(std::span<const float> pixel_values, const model::VisionGrid& grid) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  const int64_t thw[3] = {grid.t, grid.h, grid.w};
  mix(thw, sizeof(thw));
  mix(pixel_values.data(), pixel_values.size_bytes());
  return h;
}

core::Expected<ImagePrompt> ImagePrompt::make(backend::Backend& backend, std::span<const int32_t> prompt,
                                              std::span<const ImageInput> images) {
  const model::VisionConfig* vc = backend.vision();
  if (!vc) return core::Error{backend.vision_error()};
  ImagePrompt ip;
  ip.hidden_ = backend.config().hidden_size;
  std::vector<model::VisionGrid> grids;
  std::vector<float> pixels;
  for (const auto& im : images) {
    grids.push_back(im.grid);
    pixels.insert(pixels.end(), im.pixel_values.begin(), im.pixel_values.end());
  }
  DF_ASSIGN(auto pos, model::mrope_positions(prompt, vc->image_token_id, vc->video_token_id, grids, {},
                                             vc->spatial_merge_size));
  DF_ASSIGN(ip.embeds_, backend.encode_images(pixels, grids));
  ip.t_ = std::move(pos.t);
  ip.h_ = std::move(pos.h);
  ip.w_ = std::move(pos.w);
  ip.rope_delta_ = pos.rope_delta;
  // Rows in prompt order: the k-th image token takes row k (mrope_positions checked the runs against the
  // grids, and the encoder returns each image's rows in merge-window order, as the placeholders read them).
  ip.row_of_.assign(prompt.size(), -1);
  ip.keys_.assign(prompt.begin(), prompt.end());
  int32_t row = 0;
  size_t image = 0;
  int64_t in_image = 0, image_rows = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] != vc->image_token_id) continue;
    if (in_image == image_rows) {  // the next image starts
      const auto& g = images[image++].grid;
      image_rows = g.t * g.h * g.w / vc->merge_unit();
      in_image = 0;
    }
    const uint64_t k = (images[image - 1].hash ^ (static_cast<uint64_t>(in_image) * 0x9E3779B97F4A7C15ull)) *
                       0xBF58476D1CE4E5B9ull;
    ip.keys_[i] = -1 - static_cast<int32_t>((k >> 33) & 0x3FFFFFFF);
    ip.row_of_[i] = row++;
    ++in_image;
  }
  if (static_cast<size_t>(row) * static_cast<size_t>(ip.hidden_) != ip.embeds_.size())
    return core::Error{"images: the encoder gave " + std::to_string(ip.embeds_.size()) + " values for " +
                       std::to_string(row) + " image tokens"};
  return ip;
}

void ImagePrompt::fill_run(int64_t start, int64_t n, backend::SeqRun& run) {
  run_pos_.resize(static_cast<size_t>(3 * n));
  run_rows_.clear();
  run_embeds_.clear();
  const int64_t prompt = static_cast<int64_t>(t_.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = start + i;
    int64_t* thw = run_pos_.data() + 3 * i;
    if (p < prompt) {
      thw[0] = t_[static_cast<size_t>(p)];
      thw[1] = h_[static_cast<size_t>(p)];
      thw[2] = w_[static_cast<size_t>(p)];
      if (const int32_t r = row_of_[static_cast<size_t>(p)]; r >= 0) {
        run_rows_.push_back(static_cast<int32_t>(i));
        run_embeds_.insert(run_embeds_.end(), embeds_.begin() + r * hidden_,
                           embeds_.begin() + (r + 1) * hidden_);
      }
    } else {
      thw[0] = thw[1] = thw[2] = p + rope_delta_;
    }
  }
  run.mrope_positions = run_pos_;
  run.embed_rows = run_rows_;
  run.embeds = run_embeds_;
}

}  // namespace deltaflow::engine
