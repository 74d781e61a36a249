// Images in a prompt, as the engine carries them (docs/architecture.md §4): the encoder's rows for the image
// placeholder tokens, every prompt token's M-RoPE position, and the prefix-cache keys that tell images apart.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/status.hpp"
#include "model/mrope.hpp"

namespace deltaflow::engine {

// One image of a request, preprocessed (vision::preprocess_image): pixel values [t*h*w, patch_dim], its grid,
// and a hash of its content (the pixel values) that keys it in the prefix cache.
struct ImageInput {
  std::vector<float> pixel_values;
  model::VisionGrid grid;
  uint64_t hash = 0;
};

// 64-bit FNV-1a over the pixel values' bytes and the grid.
uint64_t image_content_hash(std::span<const float> pixel_values, const model::VisionGrid& grid);

class ImagePrompt {
 public:
  // Encodes the images with the backend and lays their rows out over `prompt`, whose runs of the image
  // token (already expanded to each image's token count) take the images in order. Errors: a backend without
  // a vision encoder, placeholders that do not match the images, or an encoder failure.
  static core::Expected<ImagePrompt> make(backend::Backend& backend, std::span<const int32_t> prompt,
                                          std::span<const ImageInput> images);

  // Keys for the prefix cache: the prompt's ids with each image token replaced by a negative key drawn from
  // its image's hash and its index in the image (two prompts that differ only in an image part at that
  // image), then the generated ids as they come (append()).
  std::span<const int32_t> keys() const { return keys_; }
  void append(int32_t id) { keys_.push_back(id); }

  // The SeqRun inputs of positions [start, start + n): (t, h, w) per row (text after the images continues at
  // position + rope_delta on all three axes) and the rows that take encoder output. Kept here until the step
  // has run.
  void fill_run(int64_t start, int64_t n, backend::SeqRun& run);

 private:
  int64_t hidden_ = 0;
  std::vector<int64_t> t_, h_, w_;  // prompt positions
  int64_t rope_delta_ = 0;
  std::vector<float> embeds_;    // [image tokens, hidden]
  std::vector<int32_t> row_of_;  // per prompt token: its row of embeds_, or -1
  std::vector<int32_t> keys_;
  // This step's run inputs.
  std::vector<int64_t> run_pos_;
  std::vector<int32_t> run_rows_;
  std::vector<float> run_embeds_;
};

}  // namespace deltaflow::engine
