// Turning CUDA runtime errors into Status values at the backend boundary (no exceptions cross it).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/status.hpp"

namespace deltaflow::backend::cuda {

inline core::Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return core::Status();
  return core::Error{std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e)};
}

}  // namespace deltaflow::backend::cuda

#define DF_CUDA_TRY(expr) DF_TRY(::deltaflow::backend::cuda::cuda_status((expr), #expr))
