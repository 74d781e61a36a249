#include "core/threads.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace deltaflow::core {
namespace {

thread_local bool tl_in_worker = false;

class Pool {
 public:
  explicit Pool(size_t n) {
    for (size_t i = 1; i < n; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  size_t size() const { return workers_.size() + 1; }

  // Runs task(i) for i in [0, size()), the caller taking i = 0.
  void run(const std::function<void(size_t)>& task) {
    std::unique_lock<std::mutex> run_lk(run_mu_);  // one parallel region at a time
    {
      std::lock_guard<std::mutex> lk(mu_);
      task_ = &task;
      pending_ = workers_.size();
      ++generation_;
    }
    cv_.notify_all();
    tl_in_worker = true;
    task(0);
    tl_in_worker = false;
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void loop(size_t idx) {
    tl_in_worker = true;
    size_t seen = 0;
    for (;;) {
      const std::function<void(size_t)>* task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        task = task_;
      }
      (*task)(idx);
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(size_t)>* task_ = nullptr;
  size_t pending_ = 0, generation_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p(num_threads());
  return p;
}

}  // namespace

size_t num_threads() {
  static const size_t n = [] {
    if (const char* e = std::getenv("DELTAFLOW_THREADS")) {
      const long v = std::strtol(e, nullptr, 10);
      if (v > 0) return static_cast<size_t>(v);
    }
    return static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t max_chunks = (n + grain - 1) / grain;
  if (tl_in_worker || max_chunks <= 1 || num_threads() <= 1) {
    fn(0, n);
    return;
  }
  Pool& p = pool();
  const size_t chunks = std::min(max_chunks, p.size());
  p.run([&](size_t i) {
    if (i >= chunks) return;
    const size_t b = n * i / chunks, e = n * (i + 1) / chunks;
    if (b < e) fn(b, e);
  });
}

}  // namespace deltaflow::core
