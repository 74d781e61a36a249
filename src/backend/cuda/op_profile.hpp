// Where a forward pass spends its GPU time, by op: `mark(name)` records a CUDA event on the stream, and the
// time from one mark to the next is charged to the earlier mark's name. Off unless enabled (benchmarks turn
// it on with graphs off; events inside a captured graph would not be read back).
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "core/status.hpp"

namespace deltaflow::backend::cuda {

class OpProfile {
 public:
  ~OpProfile();
  void enable(bool on) { on_ = on; }
  bool enabled() const { return on_; }
  // Starts charging GPU time on `stream` to `name` (a string literal: kept by pointer).
  void mark(const char* name, cudaStream_t stream);
  // Closes the last mark, waits for the stream, and adds the intervals to the totals.
  core::Status flush(cudaStream_t stream);
  // Seconds per op name since the last reset, largest first.
  std::vector<std::pair<std::string, double>> totals() const;
  void reset() { totals_.clear(); }

 private:
  bool on_ = false;
  std::vector<cudaEvent_t> pool_;
  std::vector<const char*> names_;  // names_[i] starts at pool_[i]
  std::vector<std::pair<std::string, double>> totals_;
};

}  // namespace deltaflow::backend::cuda
