// Prefill matmuls through cuBLASLt (linked dynamically): y[T, N] fp32 = x[T, K] @ W[N, K]^T with x and W both
// BF16 or both F16, fp32 accumulation. The algorithm for each shape is chosen once and kept.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "core/dtype.hpp"
#include "core/status.hpp"

struct cublasLtContext;

namespace deltaflow::backend::cuda {

class Gemm {
 public:
  Gemm() = default;
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  core::Status init(size_t workspace_bytes);
  bool ready() const { return handle_ != nullptr; }

  // W: [N, K] row-major; x: [T, K] packed row-major; y: [T, ldy] fp32. K % 8 == 0 and 16-byte aligned
  // pointers keep cuBLASLt on its fast kernels.
  core::Status run(const void* W, core::DType dtype, int64_t N, int64_t K, const void* x, int64_t T, float* y,
                   int64_t ldy, cudaStream_t stream);

 private:
  using Key =
      std::tuple<int, int64_t, int64_t, int64_t, int64_t, uint32_t>;  // dtype, N, K, T, ldy, alignments
  struct Algo {
    alignas(8) uint64_t data[8];  // cublasLtMatmulAlgo_t, kept opaque here
  };
  cublasLtContext* handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Algo> algos_;
};

}  // namespace deltaflow::backend::cuda
