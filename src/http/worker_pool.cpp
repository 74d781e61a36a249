#include "http/worker_pool.hpp"

#include <thread>
#include <utility>

namespace deltaflow::http {

bool WorkerPool::submit(std::function<void()> job) {
  std::unique_lock<std::mutex> lock(mu_);
  if (joining_) return false;
  jobs_.push_back(std::move(job));
  if (idle_ >= jobs_.size()) {
    work_cv_.notify_one();
    return true;
  }
  ++threads_;
  lock.unlock();
  std::thread([this] { loop(); }).detach();
  return true;
}

void WorkerPool::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (jobs_.empty()) {
      ++idle_;
      const bool woke = work_cv_.wait_for(lock, idle_exit_, [this] { return !jobs_.empty() || joining_; });
      --idle_;
      if (!woke || (jobs_.empty() && joining_)) break;
      if (jobs_.empty()) continue;
    }
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    job = nullptr;  // what the job captured goes before the pool may be destroyed
    lock.lock();
  }
  --threads_;
  exit_cv_.notify_all();
}

void WorkerPool::join() {
  std::unique_lock<std::mutex> lock(mu_);
  joining_ = true;
  work_cv_.notify_all();
  exit_cv_.wait(lock, [this] { return threads_ == 0; });
}

size_t WorkerPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_;
}

size_t WorkerPool::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_ - idle_;
}

}  // namespace deltaflow::http
