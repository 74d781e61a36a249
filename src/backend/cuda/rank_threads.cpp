#include "backend/cuda/rank_threads.hpp"

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.hpp"

namespace deltaflow::backend::cuda {

RankThreads::RankThreads(std::vector<int> devices) : devices_(std::move(devices)) {
  results_.resize(devices_.size());
  for (int r = 0; r < size(); ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> g(m_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& t : threads_) t.join();
}

core::Status RankThreads::run(const std::function<core::Status(int)>& fn) {
  std::unique_lock<std::mutex> lk(m_);
  job_ = &fn;
  pending_ = size();
  ++generation_;
  start_.notify_all();
  finished_.wait(lk, [this] { return pending_ == 0; });
  job_ = nullptr;
  for (auto& st : results_)
    if (!st.is_ok()) return st;
  return core::Status();
}

void RankThreads::loop(int r) {
  const core::Status bound =
      cuda_status(cudaSetDevice(devices_[static_cast<size_t>(r)]), "tensor parallel: cudaSetDevice");
  unsigned long long seen = 0;
  std::unique_lock<std::mutex> lk(m_);
  for (;;) {
    start_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* job = job_;
    lk.unlock();
    core::Status st = bound.is_ok() ? (*job)(r) : bound;
    lk.lock();
    results_[static_cast<size_t>(r)] = std::move(st);
    if (--pending_ == 0) finished_.notify_all();
  }
}

}  // namespace deltaflow::backend::cuda
