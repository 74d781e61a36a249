#include "server/generation_run.hpp"

#include <mutex>
#include <random>

namespace deltaflow::server {

namespace {

std::string random_chars(size_t n) {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::lock_guard<std::mutex> lock(mu);
  std::string s(n, 'a');
  for (auto& c : s) c = kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return s;
}

}  // namespace

std::string new_call_id() {
  return "call_" + random_chars(24);
}
std::string new_request_id(const char* prefix) {
  return std::string(prefix) + random_chars(24);
}

GenerationRun::GenerationRun(ServedModel& model, Metrics& metrics,
                             std::vector<engine::GenerationRequest> requests,
                             std::vector<OutputOptions> outputs,
                             std::chrono::steady_clock::time_point arrival)
    : model_(model),
      metrics_(metrics),
      channel_(std::make_shared<engine::ResponseChannel>()),
      requests_(std::move(requests)),
      arrival_(arrival) {
  choices_.resize(requests_.size());
  for (size_t i = 0; i < requests_.size(); ++i) {
    requests_[i].channel = channel_;
    requests_[i].choice = static_cast<int>(i);
    choices_[i].out = std::make_unique<ChoiceOutput>(model.tokenizer(), std::move(outputs[i]));
    choices_[i].prompt_tokens = static_cast<int64_t>(requests_[i].prompt.size());
    prompt_tokens_ += choices_[i].prompt_tokens;
  }
}

GenerationRun::~GenerationRun() {
  if (!done()) channel_->cancel();
  record_metrics();
}

std::optional<ApiError> GenerationRun::submit() {
  switch (model_.scheduler().submit(std::move(requests_))) {
    case engine::SubmitResult::kQueued:
      submitted_ = true;
      return std::nullopt;
    case engine::SubmitResult::kQueueFull:
      finished_choices_ = choices();  // nothing runs: no cancel, no metrics
      recorded_ = true;
      return queue_full();
    case engine::SubmitResult::kStopped:
      finished_choices_ = choices();
      recorded_ = true;
      return unavailable("the server is shutting down");
  }
  return internal_error("unreachable");
}

void GenerationRun::cancel() {
  channel_->cancel();
}

int64_t GenerationRun::completion_tokens() const {
  int64_t n = 0;
  for (const auto& c : choices_) n += c.completion_tokens;
  return n;
}

std::optional<std::string> GenerationRun::error() const {
  for (const auto& c : choices_)
    if (!c.error.empty()) return c.error;
  return std::nullopt;
}

bool GenerationRun::deliver(int i, OutputDelta&& d, const DeltaFn& on_delta) {
  ChoiceState& c = choices_[static_cast<size_t>(i)];
  for (const auto& call : d.calls) {
    if (call.begin) {
      c.calls.push_back({call.name, ""});
      c.call_ids.push_back(new_call_id());
    }
    if (static_cast<size_t>(call.index) < c.calls.size())
      c.calls[static_cast<size_t>(call.index)].arguments += call.arguments;
  }
  c.content += d.content;
  c.reasoning += d.reasoning;
  for (const auto& t : d.tokens) c.tokens.push_back(t);
  if (d.empty()) return true;
  return on_delta(i, d);
}

bool GenerationRun::finish_choice(int i, const std::string& reason, const DeltaFn& on_delta,
                                  const FinishFn& on_finish) {
  ChoiceState& c = choices_[static_cast<size_t>(i)];
  if (c.finished) return true;
  bool ok = deliver(i, c.out->finish(), on_delta);
  c.finished = true;
  c.finish_reason = reason == "stop" && c.out->tool_calls() > 0 ? "tool_calls" : reason;
  c.completion_tokens = c.out->tokens_used();
  ++finished_choices_;
  if (done()) end_ = std::chrono::steady_clock::now();
  if (ok && on_finish) ok = on_finish(i);
  return ok;
}

GenerationRun::Pump GenerationRun::pump(std::chrono::milliseconds wait, const DeltaFn& on_delta,
                                        const FinishFn& on_finish) {
  if (!started_) {
    started_ = true;
    for (int i = 0; i < choices(); ++i)
      if (!deliver(i, choices_[static_cast<size_t>(i)].out->start(), on_delta)) {
        cancel();
        return Pump::kGone;
      }
  }
  if (done()) return Pump::kDone;
  std::vector<engine::Event> events;
  if (!channel_->wait(wait, events)) return Pump::kIdle;
  const auto now = std::chrono::steady_clock::now();
  for (auto& e : events) {
    if (e.choice < 0 || e.choice >= choices()) continue;
    ChoiceState& c = choices_[static_cast<size_t>(e.choice)];
    if (c.finished) continue;  // e.g. the engine's late events after a stop string
    if (!e.tokens.empty()) {
      if (!first_token_) {
        first_token_ = now;
        metrics_.first_token(std::chrono::duration<double>(now - arrival_).count());
      }
      last_token_ = now;
    }
    bool ok = true;
    for (size_t k = 0; k < e.tokens.size() && ok; ++k) {
      const bool is_stop = e.finished && e.finish == engine::FinishReason::kStop &&
                           k + 1 == e.tokens.size() && e.tokens[k].id == e.stop_id;
      ok = deliver(e.choice, c.out->feed(e.tokens[k], is_stop), on_delta);
      if (ok && c.out->stopped_by_string()) {
        channel_->cancel(e.choice);
        ok = finish_choice(e.choice, "stop", on_delta, on_finish);
        break;
      }
    }
    if (e.finished) c.cached_tokens = e.cached_tokens;
    if (ok && !c.finished && e.finished) {
      switch (e.finish) {
        case engine::FinishReason::kStop:
          ok = finish_choice(e.choice, "stop", on_delta, on_finish);
          break;
        case engine::FinishReason::kLength:
          ok = finish_choice(e.choice, "length", on_delta, on_finish);
          break;
        case engine::FinishReason::kCancelled:
          c.error = "the request was cancelled";
          ok = finish_choice(e.choice, "stop", on_delta, on_finish);
          break;
        case engine::FinishReason::kAborted:  // the server's shutdown: a clean end, finish_reason "abort"
          ok = finish_choice(e.choice, "abort", on_delta, on_finish);
          break;
        case engine::FinishReason::kError:
          c.error = e.error.empty() ? "engine error" : e.error;
          ok = finish_choice(e.choice, "error", on_delta, on_finish);
          break;
      }
    }
    if (!ok) {
      cancel();
      return Pump::kGone;
    }
  }
  return done() ? Pump::kDone : Pump::kProgress;
}

int64_t GenerationRun::cached_tokens() const {
  int64_t n = 0;
  for (const auto& c : choices_) n += c.cached_tokens;
  return n;
}

int64_t GenerationRun::total_ns() const {
  const auto end = end_.value_or(std::chrono::steady_clock::now());
  return std::chrono::duration_cast<std::chrono::nanoseconds>(end - arrival_).count();
}

int64_t GenerationRun::prompt_eval_ns() const {
  if (!first_token_) return total_ns();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(*first_token_ - arrival_).count();
}

int64_t GenerationRun::eval_ns() const {
  if (!first_token_ || !last_token_) return 0;
  return std::chrono::duration_cast<std::chrono::nanoseconds>(*last_token_ - *first_token_).count();
}

void GenerationRun::record_metrics() {
  if (recorded_ || !submitted_) return;
  recorded_ = true;
  const int64_t generated = completion_tokens();
  metrics_.tokens(prompt_tokens_, generated, cached_tokens());
  if (first_token_ && last_token_ && generated > 1)
    metrics_.per_token(std::chrono::duration<double>(*last_token_ - *first_token_).count() /
                       static_cast<double>(generated - 1));
  if (last_token_) metrics_.latency(std::chrono::duration<double>(*last_token_ - arrival_).count());
  for (const auto& c : choices_)
    metrics_.finished(c.finished ? (c.error.empty() ? c.finish_reason : "error") : "abort");
}

}  // namespace deltaflow::server
