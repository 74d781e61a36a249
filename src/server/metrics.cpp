#include "server/metrics.hpp"

#include <cstdio>

namespace deltaflow::server {

namespace {

std::string fmt(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

// Label values escape backslash, quote and newline.
std::string label(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, std::string& out) const {
  uint64_t c = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    c += counts_[i];
    out += name + "_bucket{le=\"" + fmt(bounds_[i]) + "\"} " + std::to_string(c) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + fmt(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_(
          {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      tpot_({0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
             0.075, 0.1,    0.15,  0.2,    0.3,  0.4,   0.5,  0.75,  1,    2.5}),
      e2e_({0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480}) {}

void Metrics::request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route, status}];
}

void Metrics::tokens(int64_t prompt, int64_t generated, int64_t cached) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += static_cast<uint64_t>(prompt);
  generated_tokens_ += static_cast<uint64_t>(generated);
  cached_tokens_ += static_cast<uint64_t>(cached);
}

void Metrics::first_token(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(s);
}

void Metrics::per_token(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  tpot_.observe(s);
}

void Metrics::latency(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  e2e_.observe(s);
}

void Metrics::finished(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[reason];
}

std::string Metrics::render(const QueueState& q) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  header(out, "deltaflow_model_loaded", "gauge", "1 once the model is loaded and requests are served.");
  out += "deltaflow_model_loaded " + std::to_string(q.loaded ? 1 : 0) + "\n";
  header(out, "deltaflow_http_requests_total", "counter", "HTTP requests by route and status code.");
  for (const auto& [k, v] : requests_)
    out += "deltaflow_http_requests_total{route=\"" + label(k.first) + "\",status=\"" +
           std::to_string(k.second) + "\"} " + std::to_string(v) + "\n";
  header(out, "deltaflow_request_success_total", "counter", "Finished generations by finish reason.");
  for (const auto& [k, v] : finished_)
    out += "deltaflow_request_success_total{finish_reason=\"" + label(k) + "\"} " + std::to_string(v) + "\n";
  header(out, "deltaflow_prompt_tokens_total", "counter", "Prompt tokens processed.");
  out += "deltaflow_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
  header(out, "deltaflow_generation_tokens_total", "counter", "Tokens generated.");
  out += "deltaflow_generation_tokens_total " + std::to_string(generated_tokens_) + "\n";
  header(out, "deltaflow_prefix_cache_hit_tokens_total", "counter",
         "Prompt tokens served from the prefix cache.");
  out += "deltaflow_prefix_cache_hit_tokens_total " + std::to_string(cached_tokens_) + "\n";
  header(out, "deltaflow_num_requests_waiting", "gauge", "Generation requests queued for the engine.");
  out += "deltaflow_num_requests_waiting " + std::to_string(q.waiting) + "\n";
  header(out, "deltaflow_num_requests_running", "gauge", "Generation requests the engine is running.");
  out += "deltaflow_num_requests_running " + std::to_string(q.running) + "\n";
  auto gauge = [&](const char* name, const char* help, int64_t v) {
    header(out, name, "gauge", help);
    out += std::string(name) + " " + std::to_string(v) + "\n";
  };
  gauge("deltaflow_http_connections", "Open HTTP connections (serve --max-connections caps them).",
        q.http_connections);
  gauge("deltaflow_http_requests_in_flight", "HTTP requests being handled or answered.",
        q.http_requests_in_flight);
  gauge("deltaflow_kv_pages_used", "KV pages held by running sequences and the prefix cache.",
        q.kv_pages_used);
  gauge("deltaflow_kv_pages_total", "KV pages in the pool.", q.kv_pages_total);
  gauge("deltaflow_kv_pages_cache_only", "Of the KV pages used, those only the prefix cache holds.",
        q.kv_pages_cache_only);
  gauge("deltaflow_state_slots_used", "Recurrent-state slots held by running sequences and the prefix cache.",
        q.state_slots_used);
  gauge("deltaflow_state_slots_total", "Recurrent-state slots in the pool.", q.state_slots_total);
  gauge("deltaflow_prefix_cache_checkpoints", "Prefix-cache checkpoints held.", q.prefix_checkpoints);
  gauge("deltaflow_prefix_cache_bytes",
        "Memory the prefix cache holds (its slots and the pages only it holds).", q.prefix_cache_bytes);
  header(out, "deltaflow_prefix_cache_evictions_total", "counter", "Prefix-cache checkpoints evicted.");
  out += "deltaflow_prefix_cache_evictions_total " + std::to_string(q.prefix_evictions) + "\n";
  header(out, "deltaflow_num_preemptions_total", "counter",
         "Running sequences preempted (to be recomputed) when the KV pages ran out.");
  out += "deltaflow_num_preemptions_total " + std::to_string(q.preemptions) + "\n";
  header(
      out, "deltaflow_spec_decode_draft_tokens_total", "counter",
      "Speculative decoding: tokens the MTP head drafted and the model verified, by draft position (1: the "
      "first drafted token of a step).");
  for (size_t k = 0; k < q.drafted_at.size(); ++k)
    out += "deltaflow_spec_decode_draft_tokens_total{position=\"" + std::to_string(k + 1) + "\"} " +
           std::to_string(q.drafted_at[k]) + "\n";
  header(out, "deltaflow_spec_decode_accepted_tokens_total", "counter",
         "Speculative decoding: drafted tokens the model accepted, by draft position.");
  for (size_t k = 0; k < q.accepted_at.size(); ++k)
    out += "deltaflow_spec_decode_accepted_tokens_total{position=\"" + std::to_string(k + 1) + "\"} " +
           std::to_string(q.accepted_at[k]) + "\n";
  header(out, "deltaflow_time_to_first_token_seconds", "histogram",
         "From request arrival to the first generated token.");
  ttft_.render("deltaflow_time_to_first_token_seconds", out);
  header(out, "deltaflow_time_per_output_token_seconds", "histogram",
         "Mean time between generated tokens, per request.");
  tpot_.render("deltaflow_time_per_output_token_seconds", out);
  header(out, "deltaflow_e2e_request_latency_seconds", "histogram",
         "From request arrival to the last token.");
  e2e_.render("deltaflow_e2e_request_latency_seconds", out);
  return out;
}

}  // namespace deltaflow::server
