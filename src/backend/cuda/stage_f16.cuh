// The fp16 staging of a quantized GEMV's activation rows (gemv_quant.cuh, stage_activations_f16), as a
// device function, so that a kernel that writes a row can stage it in the same pass (norm.cu).
#pragma once

#include <cuda_runtime.h>

namespace deltaflow::backend::cuda {

// The exponent e >= 0 a row with largest magnitude amax is scaled down by (value * 2^-e in fp16, factor
// 2^e): 0 for every ordinary row, else the least that keeps amax below 2^15 (a non-finite amax: 0).
__device__ __forceinline__ int f16_stage_exponent(float amax) {
  if (!isfinite(amax) || amax < 32768.0f) return 0;
  int ex;
  frexpf(amax, &ex);  // amax < 2^ex
  return ex - 15;
}

}  // namespace deltaflow::backend::cuda
