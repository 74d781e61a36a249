// Prefill matmuls through cuBLASLt (linked dynamically): y[T, N] = x[T, K] @ W[N, K]^T with x and W both BF16
// or both F16, or both FP8 E4M3 with block scales (W per 128 x 128 block, x per 1 x 128 group: Qwen's FP8
// checkpoints with dynamic activations), fp32 accumulation, y in fp32 or in a 16-bit type. The algorithm for
// each shape is cuBLASLt's first heuristic choice, or, for shapes tune() has seen, the fastest of its
// candidates as timed on this GPU; either way chosen once and kept.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "core/dtype.hpp"
#include "core/status.hpp"

struct cublasLtContext;

namespace deltaflow::backend::cuda {

// One matmul: W [N, K] row-major; x [T, K] packed row-major; y [T, ldy] of y_type (kF32, or W's type; BF16
// for FP8).
// FP8 (dtype kF8E4M3, W and x both E4M3): w_scale [ceil(N / 128), K / 128] row-major, one fp32 per 128 x 128
// block of W, and x_scale [K / 128, T], one per 128 columns of an x row (fp8_activations.cuh); K / 128 a
// multiple of 4, N and T multiples of 8.
struct GemmCall {
  const void* W = nullptr;
  core::DType dtype = core::DType::kBF16;
  int64_t N = 0, K = 0;
  const void* x = nullptr;
  int64_t T = 0;
  void* y = nullptr;
  core::DType y_type = core::DType::kF32;
  int64_t ldy = 0;
  const float* w_scale = nullptr;
  const float* x_scale = nullptr;
};

// What tune() found for one shape.
struct GemmTuning {
  int64_t N = 0, K = 0, T = 0;
  int candidates = 0;      // algorithms timed
  int chosen = 0;          // index of the fastest in cuBLASLt's heuristic order
  double heuristic_s = 0;  // the first heuristic choice's time
  double best_s = 0;       // the fastest's time
};

class Gemm {
 public:
  Gemm() = default;
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  core::Status init(size_t workspace_bytes);
  bool ready() const { return handle_ != nullptr; }

  // K % 8 == 0 and 16-byte aligned pointers keep cuBLASLt on its fast kernels.
  core::Status run(const GemmCall& c, cudaStream_t stream);
  // The fp32-output form.
  core::Status run(const void* W, core::DType dtype, int64_t N, int64_t K, const void* x, int64_t T, float* y,
                   int64_t ldy, cudaStream_t stream) {
    return run(GemmCall{W, dtype, N, K, x, T, y, core::DType::kF32, ldy}, stream);
  }
  // Times up to `candidates` of cuBLASLt's algorithms for this call's shape on its buffers (y is overwritten)
  // and keeps the fastest for every later run() of the shape. For load time: it synchronises the stream. A
  // shape already chosen is left as it is.
  core::Status tune(const GemmCall& c, int candidates, cudaStream_t stream);
  // Whether cuBLASLt has an algorithm for this call's shape and types (it keeps the first for run()); no
  // launch. For load time: an FP8 block-scaled GEMM needs cuBLASLt 12.9+ on sm_90+.
  bool supports(const GemmCall& c);
  const std::vector<GemmTuning>& tunings() const { return tunings_; }

 private:
  // dtype, y_type, N, K, T, ldy, alignments
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, uint32_t>;
  struct Algo {
    alignas(8) uint64_t data[8];  // cublasLtMatmulAlgo_t, kept opaque here
  };
  struct Descs;
  core::Status describe(const GemmCall& c, Descs& d) const;
  core::Status heuristics(const GemmCall& c, Descs& d, int count, std::vector<Algo>& out) const;
  core::Status launch(const GemmCall& c, const Descs& d, const Algo& a, cudaStream_t stream) const;
  // The algorithm kept for c's key: cuBLASLt's first heuristic choice the first time (or tune()'s).
  core::Expected<const Algo*> algo_for(const GemmCall& c, Descs& d);
  static Key key_of(const GemmCall& c);

  cublasLtContext* handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Algo> algos_;
  std::vector<GemmTuning> tunings_;
};

}  // namespace deltaflow::backend::cuda
