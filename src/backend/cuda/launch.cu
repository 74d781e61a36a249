#include <cstdlib>
#include <cstring>

#include "backend/cuda/launch.cuh"

namespace deltaflow::backend::cuda {
namespace {

__global__ void kernel_pdl_probe() {}

bool probe() {
  const char* env = std::getenv("DELTAFLOW_PDL");
  if (env && std::strcmp(env, "0") == 0) return false;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, kernel_pdl_probe) != cudaSuccess) return false;
  // ptxVersion: the virtual architecture the code came from (10 * major + minor).
  return major >= 9 && fa.ptxVersion >= 90 && fa.binaryVersion >= 90;
}

}  // namespace

bool pdl_enabled() {
  static const bool on = probe();
  return on;
}

}  // namespace deltaflow::backend::cuda
