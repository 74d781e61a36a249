// The collectives a tensor-parallel rank needs (issue 7), on the rank's stream: a sum all-reduce of fp32
// partial sums and an all-gather of fp32 slices. Two implementations:
//   NCCL (make_nccl_collectives): one communicator per GPU from ncclCommInitAll in this process; the calls
//     are capturable, so each rank's decode step stays one CUDA graph. NCCL_NVLS_ENABLE=0 is set before the
//     communicators are made (NVLink multicast stays off) unless the user set it.
//   same device (make_same_device_collectives): every rank on one GPU, exchanging through device pointers
//     and host barriers. Not capturable (ranks wait on each other on the host), slow, and only for the
//     tests: it lets TP=2/4 run end to end where only one GPU is visible.
// Every rank must make the same calls in the same order (as the forward pass does).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "core/status.hpp"

namespace deltaflow::backend::cuda {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual bool capturable() const = 0;  // may be called inside CUDA graph capture
  // buf[i] = sum over ranks of buf[i], n floats; every rank ends with the same values.
  virtual core::Status all_reduce_sum(float* buf, size_t n, cudaStream_t stream) = 0;
  // recv[r * n + i] = rank r's send[i]. send may be recv + rank() * n (in place).
  virtual core::Status all_gather(const float* send, float* recv, size_t n, cudaStream_t stream) = 0;
};

// One collective per device in `devices` (rank i on devices[i]), made with ncclCommInitAll.
core::Expected<std::vector<std::unique_ptr<Collective>>> make_nccl_collectives(
    const std::vector<int>& devices);

// `world` ranks, all on the current device.
std::vector<std::unique_ptr<Collective>> make_same_device_collectives(int world);

}  // namespace deltaflow::backend::cuda
