#include "backend/cuda/op_profile.hpp"

#include <algorithm>

#include "backend/cuda/cuda_check.hpp"

namespace deltaflow::backend::cuda {

OpProfile::~OpProfile() {
  for (auto e : pool_) cudaEventDestroy(e);
}

void OpProfile::mark(const char* name, cudaStream_t stream) {
  if (!on_) return;
  const size_t i = names_.size();
  if (i == pool_.size()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    pool_.push_back(e);
  }
  if (cudaEventRecord(pool_[i], stream) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  names_.push_back(name);
}

core::Status OpProfile::flush(cudaStream_t stream) {
  if (!on_ || names_.empty()) return core::Status();
  mark(nullptr, stream);  // the end of the last interval
  DF_CUDA_TRY(cudaStreamSynchronize(stream));
  for (size_t i = 0; i + 1 < names_.size(); ++i) {
    float ms = 0;
    DF_CUDA_TRY(cudaEventElapsedTime(&ms, pool_[i], pool_[i + 1]));
    auto it =
        std::find_if(totals_.begin(), totals_.end(), [&](const auto& p) { return p.first == names_[i]; });
    if (it == totals_.end()) {
      totals_.emplace_back(names_[i], 0.0);
      it = totals_.end() - 1;
    }
    it->second += ms * 1e-3;
  }
  names_.clear();
  return core::Status();
}

std::vector<std::pair<std::string, double>> OpProfile::totals() const {
  auto v = totals_;
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return v;
}

}  // namespace deltaflow::backend::cuda
