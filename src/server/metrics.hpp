// Prometheus counters and histograms for /metrics (text exposition format 0.0.4): requests by route and
// status, prompt and generated tokens, time to first token, time per output token, end-to-end latency,
// queue depth, and prefix-cache hit tokens.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace deltaflow::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends the _bucket / _sum / _count lines.
  void render(const std::string& name, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct QueueState {
  size_t waiting = 0;
  size_t running = 0;
  bool loaded = false;
  // The engine's memory (engine::SchedulerStats).
  int64_t kv_pages_used = 0, kv_pages_total = 0, kv_pages_cache_only = 0, state_slots_used = 0,
          state_slots_total = 0;
  int64_t prefix_checkpoints = 0, prefix_cache_bytes = 0, prefix_evictions = 0, preemptions = 0;
  std::vector<int64_t> drafted_at{}, accepted_at{};  // speculative decoding, by draft position
  // The HTTP layer: open connections and requests being read, handled or written.
  int64_t http_connections = 0, http_requests_in_flight = 0;
};

class Metrics {
 public:
  Metrics();
  void request(const std::string& route, int status);
  void tokens(int64_t prompt, int64_t generated, int64_t cached);
  void first_token(double seconds);
  void per_token(double seconds);
  void latency(double seconds);
  void finished(const std::string& reason);
  std::string render(const QueueState& q) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finished_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0, cached_tokens_ = 0;
  Histogram ttft_, tpot_, e2e_;
};

}  // namespace deltaflow::server
