// Turning CUDA runtime errors into Status values at the backend boundary (no exceptions cross it).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "core/status.hpp"

namespace deltaflow::backend::cuda {

inline core::Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return core::Status();
  return core::Error{std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e)};
}

// cudaMalloc of one of the backend's big allocations (`what`: "the weights", "the KV cache and recurrent
// states", ...). Out of memory is a sentence a user can act on: what was asked, what the GPU had free, and
// the flags that make it smaller (`advice`); nothing is left allocated.
inline core::Status device_alloc(void** ptr, size_t bytes, const char* what, const char* advice) {
  const cudaError_t e = cudaMalloc(ptr, bytes);
  if (e == cudaSuccess) return core::Status();
  if (e != cudaErrorMemoryAllocation) return cuda_status(e, what);
  (void)cudaGetLastError();  // an allocation failure is not sticky: clear it so later calls do not see it
  *ptr = nullptr;
  size_t free_b = 0, total_b = 0;
  (void)cudaMemGetInfo(&free_b, &total_b);
  char buf[512];
  std::snprintf(buf, sizeof buf, "not enough GPU memory for %s: %.2f GB asked, %.2f GB free of %.2f GB; %s",
                what, static_cast<double>(bytes) / 1e9, static_cast<double>(free_b) / 1e9,
                static_cast<double>(total_b) / 1e9, advice);
  return core::Error{buf};
}

}  // namespace deltaflow::backend::cuda

#define DF_CUDA_TRY(expr) DF_TRY(::deltaflow::backend::cuda::cuda_status((expr), #expr))
