// The engine thread (DESIGN.md §5): owns the backend, takes GenerationRequests first come first served from a
// bounded queue, runs one sequence at a time (prefill, then decode token by token), samples, detects stop
// tokens and the thinking budget, and pushes the tokens to each request's ResponseChannel. It never sees
// HTTP or JSON. Continuous batching replaces `serve_one` later without changing this interface.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/backend.hpp"
#include "engine/request.hpp"

namespace deltaflow::engine {

struct SchedulerOptions {
  size_t max_queue = 256;     // requests waiting (the running one not counted); more are refused
  int64_t max_model_len = 0;  // prompt + generated tokens at most; 0: the model's max_position_embeddings
};

enum class SubmitResult { kQueued, kQueueFull, kStopped };

class Scheduler {
 public:
  // Starts the engine thread. The backend must outlive the scheduler.
  Scheduler(backend::Backend& backend, const SchedulerOptions& options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues all the requests or none (a full queue, or a stopped scheduler). Each must have a channel.
  SubmitResult submit(std::vector<GenerationRequest> requests);

  size_t waiting() const;
  bool busy() const { return busy_.load(std::memory_order_relaxed); }
  int64_t max_model_len() const { return max_model_len_; }

  // Finishes the running request as cancelled, fails the waiting ones, and joins the thread.
  void stop();

 private:
  void run();
  void serve_one(GenerationRequest& r);

  backend::Backend& backend_;
  size_t max_queue_;
  int64_t max_model_len_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationRequest> queue_;
  bool stopping_ = false;
  std::atomic<bool> stop_now_{false};
  std::atomic<bool> busy_{false};
  std::thread thread_;
};

}  // namespace deltaflow::engine
