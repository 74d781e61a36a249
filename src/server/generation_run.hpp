// One HTTP request's generation: its choices' engine requests on one ResponseChannel, their output pipelines,
// and what the response writers read (deltas as they come, totals at the end). Owned by the HTTP thread; the
// destructor cancels whatever is still running, so a client that goes away frees the engine.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.hpp"
#include "server/api_error.hpp"
#include "server/choice_output.hpp"
#include "server/metrics.hpp"
#include "server/served_model.hpp"

namespace deltaflow::server {

struct ChoiceState {
  std::unique_ptr<ChoiceOutput> out;
  bool finished = false;
  std::string finish_reason;  // "stop", "length", "tool_calls"; empty while running
  std::string error;          // set when the engine failed this choice
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // of prompt_tokens, served from the prefix cache
  int64_t completion_tokens = 0;
  // Accumulated output, for non-streaming responses and for Ollama's whole tool calls.
  std::string content, reasoning;
  std::vector<text::ToolCall> calls;
  std::vector<std::string> call_ids;  // "call_..." per call, assigned when the call begins
  std::vector<engine::SampledToken> tokens;
};

class GenerationRun {
 public:
  using DeltaFn = std::function<bool(int choice, const OutputDelta& delta)>;  // false: the client is gone
  using FinishFn = std::function<bool(int choice)>;

  GenerationRun(ServedModel& model, Metrics& metrics, std::vector<engine::GenerationRequest> requests,
                std::vector<OutputOptions> outputs, std::chrono::steady_clock::time_point arrival);
  ~GenerationRun();
  GenerationRun(const GenerationRun&) = delete;
  GenerationRun& operator=(const GenerationRun&) = delete;

  // Queues the engine requests: 429 when the queue is full, 503 when the engine is stopping.
  std::optional<ApiError> submit();

  enum class Pump { kIdle, kProgress, kDone, kGone };
  // Waits up to `wait` for engine events and turns them into deltas (start deltas first). kGone when a
  // callback returned false: everything is cancelled.
  Pump pump(std::chrono::milliseconds wait, const DeltaFn& on_delta, const FinishFn& on_finish);
  bool done() const { return finished_choices_ == static_cast<int>(choices_.size()); }
  void cancel();

  int choices() const { return static_cast<int>(choices_.size()); }
  ChoiceState& choice(int i) { return choices_[static_cast<size_t>(i)]; }
  // The first error among the choices, if any.
  std::optional<std::string> error() const;
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t completion_tokens() const;
  // Prompt tokens the prefix cache served (summed over choices).
  int64_t cached_tokens() const;
  void set_prompt_tokens(int64_t n) { prompt_tokens_ = n; }
  // Nanoseconds, for Ollama's duration fields.
  int64_t total_ns() const;
  int64_t prompt_eval_ns() const;
  int64_t eval_ns() const;

 private:
  bool deliver(int choice, OutputDelta&& d, const DeltaFn& on_delta);
  bool finish_choice(int choice, const std::string& reason, const DeltaFn& on_delta,
                     const FinishFn& on_finish);
  void record_metrics();

  ServedModel& model_;
  Metrics& metrics_;
  std::shared_ptr<engine::ResponseChannel> channel_;
  std::vector<engine::GenerationRequest> requests_;  // moved into the queue by submit()
  std::vector<ChoiceState> choices_;
  int finished_choices_ = 0;
  bool started_ = false;
  bool submitted_ = false;
  bool recorded_ = false;
  int64_t prompt_tokens_ = 0;
  std::chrono::steady_clock::time_point arrival_;
  std::optional<std::chrono::steady_clock::time_point> first_token_, last_token_, end_;
};

// "call_" + 24 random characters, as OpenAI's ids look.
std::string new_call_id();
// "chatcmpl-..." / "cmpl-..." request ids.
std::string new_request_id(const char* prefix);

}  // namespace deltaflow::server
