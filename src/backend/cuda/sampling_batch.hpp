// Host side of GPU sampling: turns a batch of backend::SamplingSpec rows into the kernel's per-row
// parameters and penalty entries, stages them through pinned memory, launches sample_rows and brings the ids
// back. Its buffers grow on demand and are kept between calls.
#pragma once

#include <cuda_runtime.h>

#include <span>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/sampling.cuh"

namespace deltaflow::backend::cuda {

// Row i's parameters and penalty entries (distinct ids: the prompt-seen ids and the generated ones, with
// the generated counts) for specs[i], appended to `rows` / `entries`. Ids outside [0, vocab) are dropped.
void build_sample_rows(std::span<const SamplingSpec> specs, int64_t vocab, std::vector<SampleRowParams>& rows,
                       std::vector<PenaltyEntry>& entries);

class SamplingBatch {
 public:
  SamplingBatch() = default;
  ~SamplingBatch();
  SamplingBatch(const SamplingBatch&) = delete;
  SamplingBatch& operator=(const SamplingBatch&) = delete;

  // Draws specs.size() ids from the device rows logits[0 .. specs.size(), V) (penalised in place), on
  // `stream`, and appends them to `ids` (synchronizes the stream).
  core::Status run(float* logits, int64_t V, std::span<const SamplingSpec> specs, cudaStream_t stream,
                   std::vector<int32_t>& ids);

 private:
  core::Status reserve(size_t bytes);

  std::vector<SampleRowParams> rows_;
  std::vector<PenaltyEntry> entries_;
  void* pinned_ = nullptr;  // [rows][entries][out ids]
  void* device_ = nullptr;  // the same layout
  size_t capacity_ = 0;
};

}  // namespace deltaflow::backend::cuda
