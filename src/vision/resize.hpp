// Bicubic resize with antialias of 8-bit RGB, bit-exact with what transformers 5.17's torchvision backend
// gets on the CPU: torchvision.transforms.v2.functional.resize(uint8 tensor, BICUBIC, antialias=True) runs
// torch's native uint8 kernel (aten UpSampleKernel.cpp `_compute_indices_int16_weights_aa` + the PIL-SIMD
// derived convolutions): Keys cubic a = -0.5, support 2 * scale when shrinking, weights normalised in double
// and rounded to int16 with a per-axis precision, horizontal pass first then vertical, each rounded and
// clamped to uint8. An axis whose size does not change is not filtered.
#pragma once

#include <cstdint>

#include "vision/image.hpp"

namespace deltaflow::vision {

Image resize_bicubic_antialias(const Image& in, int64_t out_width, int64_t out_height);

}  // namespace deltaflow::vision
