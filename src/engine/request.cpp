#include "engine/request.hpp"

namespace deltaflow::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kAborted:
      return "abort";
  }
  return "error";
}

void ResponseChannel::push(Event e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Coalesce with the previous unfinished event of the same choice: the consumer sees the same tokens in
    // the same order, in fewer wake-ups.
    if (!events_.empty() && events_.back().choice == e.choice && !events_.back().finished) {
      Event& last = events_.back();
      for (auto& t : e.tokens) last.tokens.push_back(std::move(t));
      last.finished = e.finished;
      last.finish = e.finish;
      last.stop_id = e.stop_id;
      last.error = std::move(e.error);
      last.prompt_tokens = e.prompt_tokens;
      last.cached_tokens = e.cached_tokens;
      last.completion_tokens = e.completion_tokens;
      last.drafted_tokens = e.drafted_tokens;
      last.accepted_tokens = e.accepted_tokens;
      if (!e.prompt_logprobs.empty()) last.prompt_logprobs = std::move(e.prompt_logprobs);
      if (!e.prompt_top.empty()) last.prompt_top = std::move(e.prompt_top);
      if (!e.prompt_ranks.empty()) last.prompt_ranks = std::move(e.prompt_ranks);
    } else {
      events_.push_back(std::move(e));
    }
  }
  cv_.notify_one();
}

void ResponseChannel::cancel(int choice) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_choices_.push_back(choice);
}

bool ResponseChannel::cancelled(int choice) const {
  if (cancelled()) return true;
  std::lock_guard<std::mutex> lock(mu_);
  for (int c : cancelled_choices_)
    if (c == choice) return true;
  return false;
}

bool ResponseChannel::wait(std::chrono::milliseconds timeout, std::vector<Event>& out) {
  out.clear();
  std::unique_lock<std::mutex> lock(mu_);
  if (events_.empty() && !cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return true;
}

}  // namespace deltaflow::engine
