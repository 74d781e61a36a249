#include "vision/resize.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace deltaflow::vision {
namespace {

// HelperInterpCubic::aa_filter (use_keys_cubic: a = -0.5), in double.
double keys_cubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

struct AxisWeights {
  std::vector<int64_t> start, count;  // per output index: first input index and number of taps
  std::vector<int16_t> w;             // [out, taps]
  int64_t taps = 0;
  int precision = 0;
};

AxisWeights axis_weights(int64_t in, int64_t out) {
  AxisWeights a;
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;  // interp_size 4, times 0.5
  a.taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  std::vector<double> wf(static_cast<size_t>(out * a.taps), 0.0);
  a.start.resize(static_cast<size_t>(out));
  a.count.resize(static_cast<size_t>(out));
  for (int64_t i = 0; i < out; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    const int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    const int64_t xsize = std::min(static_cast<int64_t>(center + support + 0.5), in) - xmin;
    double* w = wf.data() + i * a.taps;
    double total = 0.0;
    for (int64_t j = 0; j < xsize; ++j) {
      w[j] = keys_cubic((static_cast<double>(j + xmin) - center + 0.5) * invscale);
      total += w[j];
    }
    if (total != 0.0)
      for (int64_t j = 0; j < xsize; ++j) w[j] /= total;
    a.start[static_cast<size_t>(i)] = xmin;
    a.count[static_cast<size_t>(i)] = xsize;
  }
  double w_max = wf[0];
  for (double v : wf) w_max = std::max(w_max, v);
  for (a.precision = 0; a.precision < 22; ++a.precision)
    if (static_cast<int>(0.5 + w_max * (1 << (a.precision + 1))) >= (1 << 15)) break;
  a.w.resize(wf.size());
  const double s = static_cast<double>(1 << a.precision);
  for (size_t k = 0; k < wf.size(); ++k)
    a.w[k] = static_cast<int16_t>(wf[k] < 0 ? static_cast<int>(-0.5 + wf[k] * s)
                                            : static_cast<int>(0.5 + wf[k] * s));
  return a;
}

inline uint8_t clip_u8(int32_t v) {
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// Resamples along x (stride_in between taps = 3 bytes) or y (a row): out[o] for `n_lines` lines.
void resample_horizontal(const uint8_t* in, int64_t in_w, int64_t h, const AxisWeights& a, int64_t out_w,
                         uint8_t* out) {
  const int32_t round = 1 << (a.precision - 1);
  for (int64_t y = 0; y < h; ++y) {
    const uint8_t* row = in + y * in_w * 3;
    uint8_t* orow = out + y * out_w * 3;
    for (int64_t x = 0; x < out_w; ++x) {
      const int16_t* k = a.w.data() + x * a.taps;
      const uint8_t* src = row + a.start[static_cast<size_t>(x)] * 3;
      int32_t s0 = round, s1 = round, s2 = round;
      for (int64_t j = 0; j < a.count[static_cast<size_t>(x)]; ++j) {
        s0 += k[j] * src[3 * j];
        s1 += k[j] * src[3 * j + 1];
        s2 += k[j] * src[3 * j + 2];
      }
      orow[3 * x] = clip_u8(s0 >> a.precision);
      orow[3 * x + 1] = clip_u8(s1 >> a.precision);
      orow[3 * x + 2] = clip_u8(s2 >> a.precision);
    }
  }
}

void resample_vertical(const uint8_t* in, int64_t w, const AxisWeights& a, int64_t out_h, uint8_t* out) {
  const int32_t round = 1 << (a.precision - 1);
  const int64_t row_bytes = w * 3;
  std::vector<int32_t> acc(static_cast<size_t>(row_bytes));
  for (int64_t y = 0; y < out_h; ++y) {
    std::fill(acc.begin(), acc.end(), round);
    const int16_t* k = a.w.data() + y * a.taps;
    const int64_t y0 = a.start[static_cast<size_t>(y)];
    for (int64_t j = 0; j < a.count[static_cast<size_t>(y)]; ++j) {
      const uint8_t* src = in + (y0 + j) * row_bytes;
      const int32_t kj = k[j];
      for (int64_t i = 0; i < row_bytes; ++i) acc[static_cast<size_t>(i)] += kj * src[i];
    }
    uint8_t* orow = out + y * row_bytes;
    for (int64_t i = 0; i < row_bytes; ++i) orow[i] = clip_u8(acc[static_cast<size_t>(i)] >> a.precision);
  }
}

}  // namespace

Image resize_bicubic_antialias(const Image& in, int64_t out_width, int64_t out_height) {
  Image cur = in;
  if (out_width != in.width) {
    const AxisWeights a = axis_weights(in.width, out_width);
    Image next;
    next.width = out_width;
    next.height = cur.height;
    next.rgb.resize(static_cast<size_t>(out_width * cur.height * 3));
    resample_horizontal(cur.rgb.data(), cur.width, cur.height, a, out_width, next.rgb.data());
    cur = std::move(next);
  }
  if (out_height != in.height) {
    const AxisWeights a = axis_weights(in.height, out_height);
    Image next;
    next.width = cur.width;
    next.height = out_height;
    next.rgb.resize(static_cast<size_t>(cur.width * out_height * 3));
    resample_vertical(cur.rgb.data(), cur.width, a, out_height, next.rgb.data());
    cur = std::move(next);
  }
  return cur;
}

}  // namespace deltaflow::vision
