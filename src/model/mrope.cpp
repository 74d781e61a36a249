#include "model/mrope.hpp"

#include <algorithm>
#include <string>

namespace deltaflow::model {

core::Expected<MropePositions> mrope_positions(std::span<const int32_t> ids, int64_t image_token_id,
                                               int64_t video_token_id, std::span<const VisionGrid> images,
                                               std::span<const VisionGrid> videos, int64_t merge) {
  if (merge <= 0) return core::Error{"mrope: spatial_merge_size must be positive"};
  // Videos: one grid per frame, t = 1 (get_rope_index repeats video_grid_thw by its t).
  std::vector<VisionGrid> frames;
  for (const auto& v : videos)
    for (int64_t f = 0; f < v.t; ++f) frames.push_back({1, v.h, v.w});
  size_t next_image = 0, next_frame = 0;
  MropePositions out;
  const size_t n = ids.size();
  out.t.reserve(n);
  out.h.reserve(n);
  out.w.reserve(n);
  int64_t pos = 0, max_pos = -1;
  size_t i = 0;
  while (i < n) {
    const int kind = ids[i] == image_token_id ? 1 : ids[i] == video_token_id ? 2 : 0;
    size_t j = i;
    while (j < n && (ids[j] == image_token_id ? 1 : ids[j] == video_token_id ? 2 : 0) == kind) ++j;
    const int64_t run = static_cast<int64_t>(j - i);
    if (kind == 0) {
      for (int64_t k = 0; k < run; ++k) {
        out.t.push_back(pos + k);
        out.h.push_back(pos + k);
        out.w.push_back(pos + k);
      }
      pos += run;
      max_pos = std::max(max_pos, pos - 1);
    } else {
      const bool image = kind == 1;
      const size_t have = image ? images.size() : frames.size();
      size_t& next = image ? next_image : next_frame;
      const char* what = image ? "image" : "video frame";
      if (next >= have)
        return core::Error{std::string("mrope: more ") + what + " placeholder runs than " + what + "s (" +
                           std::to_string(have) + ")"};
      const VisionGrid g = image ? images[next] : frames[next];
      ++next;
      if (g.t <= 0 || g.h <= 0 || g.w <= 0 || g.h % merge || g.w % merge)
        return core::Error{std::string("mrope: ") + what +
                           " grid is not a positive multiple of the merge size"};
      const int64_t lt = g.t, lh = g.h / merge, lw = g.w / merge;
      if (run != lt * lh * lw)
        return core::Error{std::string("mrope: ") + what + " " + std::to_string(next) + " has " +
                           std::to_string(run) + " placeholder tokens, its grid needs " +
                           std::to_string(lt * lh * lw)};
      for (int64_t a = 0; a < lt; ++a)
        for (int64_t r = 0; r < lh; ++r)
          for (int64_t c = 0; c < lw; ++c) {
            out.t.push_back(pos + a);  // time_interval 1
            out.h.push_back(pos + r);
            out.w.push_back(pos + c);
          }
      max_pos = std::max({max_pos, pos + lt - 1, pos + lh - 1, pos + lw - 1});
      pos += std::max(g.h, g.w) / merge;
    }
    i = j;
  }
  if (next_image != images.size())
    return core::Error{"mrope: " + std::to_string(images.size()) + " images but " +
                       std::to_string(next_image) + " image placeholder runs"};
  if (next_frame != frames.size())
    return core::Error{"mrope: " + std::to_string(frames.size()) + " video frames but " +
                       std::to_string(next_frame) + " video placeholder runs"};
  out.rope_delta = max_pos + 1 - static_cast<int64_t>(n);
  return out;
}

int mrope_axis(int64_t i, std::span<const int64_t> s, bool interleaved) {
  if (s.size() < 3) return 0;
  if (interleaved) {
    if (i % 3 == 1 && i < 3 * s[1]) return 1;
    if (i % 3 == 2 && i < 3 * s[2]) return 2;
    return 0;
  }
  if (i < s[0]) return 0;
  if (i < s[0] + s[1]) return 1;
  return 2;
}

}  // namespace deltaflow::model
