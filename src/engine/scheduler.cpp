#include "engine/scheduler.hpp"

#include <algorithm>
#include <exception>

#include "engine/token_picker.hpp"

namespace deltaflow::engine {

Scheduler::Scheduler(backend::Backend& backend, const SchedulerOptions& options)
    : backend_(backend),
      max_queue_(options.max_queue),
      max_model_len_(options.max_model_len > 0 ? options.max_model_len
                                               : backend.config().max_position_embeddings) {
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
  stop();
}

SubmitResult Scheduler::submit(std::vector<GenerationRequest> requests) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return SubmitResult::kStopped;
    // Requests whose clients left while they waited give their places up now.
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->channel->cancelled(it->choice)) {
        Event e;
        e.choice = it->choice;
        e.finished = true;
        e.finish = FinishReason::kCancelled;
        e.prompt_tokens = static_cast<int64_t>(it->prompt.size());
        it->channel->push(std::move(e));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    if (queue_.size() + requests.size() > max_queue_) return SubmitResult::kQueueFull;
    for (auto& r : requests) queue_.push_back(std::move(r));
  }
  cv_.notify_one();
  return SubmitResult::kQueued;
}

size_t Scheduler::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void Scheduler::stop() {
  std::deque<GenerationRequest> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    left.swap(queue_);
  }
  stop_now_.store(true);
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& r : left) {
    Event e;
    e.choice = r.choice;
    e.finished = true;
    e.finish = FinishReason::kError;
    e.error = "the server is shutting down";
    if (r.channel) r.channel->push(std::move(e));
  }
}

void Scheduler::run() {
  for (;;) {
    GenerationRequest r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      r = std::move(queue_.front());
      queue_.pop_front();
      busy_.store(true);
    }
    try {
      serve_one(r);
    } catch (const std::exception& ex) {
      // A backend that throws (allocation failure) fails this request, not the process.
      Event e;
      e.choice = r.choice;
      e.finished = true;
      e.finish = FinishReason::kError;
      e.error = std::string("engine failure: ") + ex.what();
      r.channel->push(std::move(e));
    }
    busy_.store(false);
  }
}

void Scheduler::serve_one(GenerationRequest& r) {
  Event done;
  done.choice = r.choice;
  done.finished = true;
  done.prompt_tokens = static_cast<int64_t>(r.prompt.size());
  auto fail = [&](const std::string& message) {
    done.finish = FinishReason::kError;
    done.error = message;
    r.channel->push(std::move(done));
  };
  if (r.channel->cancelled(r.choice)) {
    done.finish = FinishReason::kCancelled;
    r.channel->push(std::move(done));
    return;
  }
  // The HTTP side validates all of this with better messages; these checks keep the engine safe on its own.
  const int64_t vocab = backend_.config().vocab_size;
  auto in_vocab = [&](int32_t id) { return id >= 0 && id < vocab; };
  if (r.prompt.empty()) return fail("the prompt is empty");
  if (!std::all_of(r.prompt.begin(), r.prompt.end(), in_vocab) ||
      !std::all_of(r.forced_ids.begin(), r.forced_ids.end(), in_vocab) ||
      !std::all_of(r.thinking.close_ids.begin(), r.thinking.close_ids.end(), in_vocab))
    return fail("a token id is outside the vocabulary");
  if (r.max_tokens < 0) return fail("max_tokens is negative");
  if (static_cast<int64_t>(r.prompt.size()) + r.max_tokens > max_model_len_)
    return fail("prompt + max_tokens exceeds the model length");

  auto seq = backend_.new_sequence();
  std::vector<float> logits;
  backend::PrefillItem item{seq.get(), r.prompt, false};
  if (auto s = backend_.prefill(std::span<const backend::PrefillItem>(&item, 1), logits); !s)
    return fail(s.message());

  const size_t V = static_cast<size_t>(vocab);
  // Sampling runs on the backend when it can and the request reads no logits (logprobs).
  // [structured outputs] a constraint masks the host row: sample on the host (lead: port to the new step).
  TokenPicker picker(backend_, r.sampling, /*need_logits=*/r.logprobs || r.constraint != nullptr);
  picker.add_prompt(r.prompt);
  if (auto s = picker.start(std::span<const float>(logits.data(), V)); !s) return fail(s.message());
  std::deque<int32_t> forced(r.forced_ids.begin(), r.forced_ids.end());
  bool in_thought = r.thinking.open_at_start;
  bool closing = false;  // the forced close of the thought is under way
  int thought_tokens = 0;
  int64_t generated = 0;
  std::vector<uint32_t> constraint_mask;  // [structured outputs]
  std::vector<float> masked;

  for (;;) {
    if (r.channel->cancelled(r.choice) || stop_now_.load(std::memory_order_relaxed)) {
      done.finish = FinishReason::kCancelled;
      break;
    }
    if (generated >= r.max_tokens) {
      done.finish = FinishReason::kLength;
      break;
    }
    if (in_thought && !closing && r.thinking.max_tokens >= 0 && thought_tokens >= r.thinking.max_tokens) {
      forced.insert(forced.begin(), r.thinking.close_ids.begin(), r.thinking.close_ids.end());
      closing = true;
    }
    const std::span<const float> row(logits.data(), V);
    int32_t id;
    if (!forced.empty()) {
      id = forced.front();
      forced.pop_front();
    } else if (r.constraint) {
      // [structured outputs] mask, then sample from the masked copy; no allowed id: the output is complete.
      constraint_mask.resize(TokenConstraint::mask_words(V));
      r.constraint->fill_mask(constraint_mask);
      if (std::none_of(constraint_mask.begin(), constraint_mask.end(), [](uint32_t w) { return w != 0; })) {
        done.finish = FinishReason::kStop;
        break;
      }
      masked.assign(row.begin(), row.end());
      TokenConstraint::apply_mask(constraint_mask, masked);
      id = picker.pick(masked);
    } else {
      id = picker.pick(row);
    }
    if (r.constraint && !r.constraint->accept(id))
      return fail("token " + std::to_string(id) + " breaks the grammar");
    picker.accept(id);
    ++generated;

    SampledToken tok;
    tok.id = id;
    if (r.logprobs) {
      tok.logprob = chosen_logprob(row, id).logprob;
      tok.top = top_logprobs(row, r.top_logprobs);
    }
    if (id == r.thinking.start_id && r.thinking.start_id >= 0) {
      in_thought = true;
      thought_tokens = 0;
    } else if (id == r.thinking.end_id && r.thinking.end_id >= 0) {
      in_thought = false;
      closing = false;
    } else if (in_thought) {
      ++thought_tokens;
    }

    const bool is_stop = std::find(r.stop_ids.begin(), r.stop_ids.end(), id) != r.stop_ids.end();
    if (is_stop) {
      done.tokens.push_back(std::move(tok));
      done.finish = FinishReason::kStop;
      done.stop_id = id;
      break;
    }
    if (generated >= r.max_tokens) {
      done.tokens.push_back(std::move(tok));
      done.finish = FinishReason::kLength;
      break;
    }
    Event e;
    e.choice = r.choice;
    e.tokens.push_back(std::move(tok));
    r.channel->push(std::move(e));

    if (auto st = picker.advance(seq.get(), id, logits); !st) {
      done.completion_tokens = generated;
      return fail(st.message());
    }
  }
  done.completion_tokens = generated;
  r.channel->push(std::move(done));
}

}  // namespace deltaflow::engine
