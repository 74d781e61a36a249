// Multimodal rotary positions (M-RoPE) of Qwen3.5, as transformers 5.17 computes them
// (modeling_qwen3_5.py Qwen3_5Model.get_rope_index / get_vision_position_ids, apply_interleaved_mrope).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.hpp"

namespace deltaflow::model {

// One image's (or video's) patch grid, image_grid_thw: frames, patch rows, patch columns (before the merge).
struct VisionGrid {
  int64_t t = 1, h = 0, w = 0;
};

struct MropePositions {
  // [3][n]: the temporal, height and width position of every token.
  std::vector<int64_t> t, h, w;
  // max position + 1 - n: decoding continues at position (tokens so far + rope_delta) for all three axes.
  int64_t rope_delta = 0;
};

// Positions for a prompt. Runs of `image_token_id` tokens take the next grid of `images` in order, runs of
// `video_token_id` the next frame of `videos` (each video is split into t one-frame grids, as the reference
// does). Text tokens get (p, p, p) with p counting up; a vision run of llm_h x llm_w tokens (grid / merge)
// gets t = p0 + frame, h = p0 + row, w = p0 + col, after which p advances by max(grid_h, grid_w) / merge. A
// run whose length is not its grid's token count, or more runs than grids, or grids left over, is an error.
core::Expected<MropePositions> mrope_positions(std::span<const int32_t> ids, int64_t image_token_id,
                                               int64_t video_token_id, std::span<const VisionGrid> images,
                                               std::span<const VisionGrid> videos,
                                               int64_t spatial_merge_size);

// Which position (0 = t, 1 = h, 2 = w) rotary frequency i (0 <= i < rotary_dim / 2) takes. Interleaved
// (Qwen3.5, mrope_interleaved): h where i % 3 == 1 and i < 3 * section[1], w where i % 3 == 2 and
// i < 3 * section[2], t elsewhere. Not interleaved (Qwen2-VL): consecutive blocks of section[0], [1], [2].
int mrope_axis(int64_t i, std::span<const int64_t> mrope_section, bool interleaved);

}  // namespace deltaflow::model
