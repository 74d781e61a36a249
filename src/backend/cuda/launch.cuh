// Kernel launches with programmatic dependent launch (PDL, sm_90+). A kernel launched through launch() may
// start while the kernel before it in the stream is still finishing: it runs its prologue (index maths,
// L2 prefetch of weights, which no kernel writes) and then blocks in pdl_wait() until that kernel has
// completed and its writes are visible. Every kernel launched here must call pdl_wait() in every thread
// before it reads or writes any activation, state or output buffer; kernels that may not do so are launched
// with <<<>>>, which keeps full stream order. pdl_launch_dependents() lets the next kernel start early.
//
// DELTAFLOW_PDL=0 turns the attribute off (every launch fully ordered), for comparing and for debugging.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace deltaflow::backend::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Both, at a kernel's start: for kernels with nothing to do before their inputs are ready.
__device__ __forceinline__ void pdl_enter() {
  pdl_launch_dependents();
  pdl_wait();
}

// Brings the 128-byte line holding p into L2 (no register result, so it does not stall the thread).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// True when launches may overlap: the GPU is sm_90+, the kernels were built for it (a PTX-only build for an
// older target has no griddepcontrol and must not be overlapped), and DELTAFLOW_PDL is not 0.
bool pdl_enabled();

template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace deltaflow::backend::cuda
