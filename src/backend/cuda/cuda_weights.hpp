// The model's weights on the device, in one allocation: a layout pass run twice (at base 0 to size the
// allocation, then at its real base) places every matrix and vector in the form the kernels read (16-bit, or
// the quantized layouts of quant_pack.hpp, MoE experts stacked), and the fill uploads them through pinned
// staging or, for synthetic weights, writes random values on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/gemv_quant.cuh"
#include "core/status.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"

namespace deltaflow::backend::cuda {

// Where the weights come from: a bound checkpoint, or (null) synthetic values, in synthetic_quant's format
// where it is set ("nvfp4-mixed", "fp8-block").
struct WeightSource {
  const model::ModelWeights* weights = nullptr;
  std::string synthetic_quant;
  bool quant_experts = true;  // routed experts may keep their quantized layout (not exact, not sharded)
  // The MTP head too: the checkpoint's (when it has a whole one), or synthetic when the config has one.
  bool mtp = false;
};

// What fills one region of the weight allocation: host bytes (mmap'd checkpoint), converted fp32 values, or
// random values (synthetic).
struct Job {
  size_t off = 0, bytes = 0;
  const void* src = nullptr;
  std::vector<float> f32;
  std::vector<uint8_t> owned;  // bytes made at load (quantized layouts, widened matrices)
  bool quant_random = false;   // synthetic quantized weights: fill_quant_random(qw)
  QuantWeight qw;
  bool random = false;
  core::DType dtype = core::DType::kBF16;
  int64_t n = 0;
  float scale = 0, shift = 0;
};

// The layout at `base`: every matrix and vector's device address, the allocation's size, the jobs that fill
// it, and the bytes of quantized weights widened to bf16 (a quantized router; the MoE matrices in exact mode,
// sharded, or of mixed layouts).
struct PlacedWeights {
  size_t bytes = 0;
  uint64_t widened = 0;
  DMat embed, lm_head;
  float* final_norm = nullptr;
  float* inv_freq = nullptr;
  std::vector<DLayer> layers;
  DMtp mtp;
  std::vector<Job> jobs;
};

core::Expected<PlacedWeights> lay_out_weights(const model::TextConfig& c, const WeightSource& src,
                                              uintptr_t base);

// Runs the jobs into the allocation at base (seed: the synthetic values'; progress: a bar on a terminal).
core::Status fill_weights(std::vector<Job>& jobs, uint8_t* base, uint64_t seed, bool progress,
                          cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
