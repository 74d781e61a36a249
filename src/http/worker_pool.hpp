// The threads handlers run on. A handler may block for a whole generation (a streamed response waits on the
// engine), so the pool grows with the requests in flight rather than making one wait behind another; a
// thread idle for a while exits. How many requests may be in flight is bounded by the server's connection
// cap (one request at a time per connection).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

namespace deltaflow::http {

class WorkerPool {
 public:
  explicit WorkerPool(std::chrono::milliseconds idle_exit = std::chrono::seconds(30))
      : idle_exit_(idle_exit) {}
  ~WorkerPool() { join(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs `job` on an idle thread, or a new one. Refused (false) once join() has begun.
  bool submit(std::function<void()> job);
  // Lets queued and running jobs finish, then waits for every thread to exit.
  void join();
  size_t threads() const;
  size_t busy() const;

 private:
  void loop();

  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, exit_cv_;
  std::deque<std::function<void()>> jobs_;
  size_t threads_ = 0, idle_ = 0;
  bool joining_ = false;
};

}  // namespace deltaflow::http
