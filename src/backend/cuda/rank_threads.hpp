// One long-lived host thread per tensor-parallel rank, each bound to its GPU (cudaSetDevice once): the
// TpBackend runs every rank's share of a step on its thread, so the ranks' launches and their collectives
// proceed side by side.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.hpp"

namespace deltaflow::backend::cuda {

class RankThreads {
 public:
  explicit RankThreads(std::vector<int> devices);  // thread r on devices[r]
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  // Runs fn(r) on thread r for every rank and waits for all; the first failing rank's error.
  core::Status run(const std::function<core::Status(int)>& fn);

 private:
  void loop(int r);

  std::vector<int> devices_;
  std::mutex m_;
  std::condition_variable start_, finished_;
  const std::function<core::Status(int)>* job_ = nullptr;
  unsigned long long generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<core::Status> results_;
  std::vector<std::thread> threads_;
};

}  // namespace deltaflow::backend::cuda
