// What crosses the queues between the HTTP threads and the engine thread (DESIGN.md §5): a GenerationRequest
// (token ids and native parameters, never JSON) goes in; Events (sampled ids, log-probabilities, a finish
// reason) come back through the request's ResponseChannel. A channel may serve several choices of one HTTP
// request (n > 1, or several prompts), each tagged with its index.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/constraint.hpp"
#include "engine/image_prompt.hpp"
#include "engine/sampler.hpp"

namespace deltaflow::engine {

enum class FinishReason {
  kStop,       // a stop token (or, decided by the HTTP side, a stop string)
  kLength,     // max_tokens reached
  kCancelled,  // the client went away or the HTTP side stopped it (stop string)
  kError,      // the engine failed; Event::error says why
  kAborted,    // the server stopped it before its end (shutdown after --shutdown-timeout): "abort"
};
const char* finish_reason_name(FinishReason r);

// Caps the thought of a reasoning model: after `max_tokens` tokens inside <think>...</think> without a close,
// the engine feeds `close_ids` (e.g. the ids of "\n</think>\n\n") as the next tokens instead of sampling.
struct ThinkingBudget {
  int max_tokens = -1;             // < 0: unlimited
  int32_t start_id = -1;           // <think>: a generated one opens a thought
  int32_t end_id = -1;             // </think>: closes it
  bool open_at_start = false;      // the prompt ends inside a thought (the template opened it)
  std::vector<int32_t> close_ids;  // forced when the budget runs out
};

class ResponseChannel;

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 16;            // generated tokens at most (forced ones included)
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these (eos unless ignore_eos)
  int top_logprobs = 0;           // alternatives per token in events (0..20)
  bool logprobs = false;          // fill SampledToken::logprob / top
  // Log-probabilities of the prompt's tokens (teacher forcing): Event::prompt_logprobs[i] = log p(prompt[i+1]
  // | prompt[..i]). Such a prompt is computed in full (no prefix-cache reuse: the cache holds no logits).
  bool prompt_logprobs = false;
  int prompt_top_logprobs = -1;  // >= 0: also the k most likely ids and the prompt token's rank, per position
  // Token counts at which the prompt's rendered messages end: the prefix cache keeps the recurrent state
  // there too, so that a later conversation that rewrites what follows (Qwen3.5 templates drop earlier
  // <think> blocks) still reuses the prefix up to the last unchanged message.
  std::vector<int64_t> message_ends;
  ThinkingBudget thinking;
  std::vector<int32_t>
      forced_ids;  // test hook: emitted in order instead of sampled ones, then sampling goes on
  std::shared_ptr<ResponseChannel> channel;
  int choice = 0;  // index of this request's choice in the channel
  // Structured output: masks each step (null: none).
  std::shared_ptr<TokenConstraint> constraint;
  // Speculative decoding: draft tokens per step at most, below the engine's --speculative-tokens (< 0: the
  // engine's; 0: off for this request).
  int speculative_tokens = -1;
  // Images, in the order of the prompt's image-token runs (each run already expanded to its image's token
  // count, text/vision_placeholders.hpp). The engine encodes them with the backend when the request arrives.
  std::vector<ImageInput> images;
};

struct SampledToken {
  int32_t id = 0;
  float logprob = 0.0f;           // log p(id) under the raw model distribution (when logprobs)
  std::vector<TokenLogprob> top;  // the top_logprobs most likely ids (when logprobs)
};

struct Event {
  int choice = 0;
  std::vector<SampledToken> tokens;  // new tokens, in order
  bool finished = false;
  FinishReason finish = FinishReason::kStop;
  int32_t stop_id = -1;           // the stop token that ended it (it is the last of `tokens`)
  std::string error;              // kError only
  int64_t prompt_tokens = 0;      // set when finished
  int64_t cached_tokens = 0;      // prompt tokens served from the prefix cache (set when finished)
  int64_t completion_tokens = 0;  // set when finished
  // log p(prompt[i+1] | prompt[..i]) for every i (prompt_logprobs requests), in double; set when finished.
  std::vector<double> prompt_logprobs;
  std::vector<std::vector<TokenLogprob>>
      prompt_top;                     // prompt_top_logprobs >= 0: per position, most likely first
  std::vector<int64_t> prompt_ranks;  // prompt_top_logprobs >= 0: 1 + ids scoring above the token
  // Speculative decoding, set when finished: tokens the MTP head drafted for this request, and those the
  // model accepted.
  int64_t drafted_tokens = 0, accepted_tokens = 0;
};

// A multi-producer (engine), single-consumer (HTTP thread) queue of events, plus the cancellation flag both
// sides read. Tokens pushed before the consumer looks are coalesced per choice so a slow client costs
// nothing on the engine side.
class ResponseChannel {
 public:
  void push(Event e);
  // Moves every pending event into `out` (cleared first). Waits up to `timeout` when none is pending.
  // Returns false on timeout with nothing pending.
  bool wait(std::chrono::milliseconds timeout, std::vector<Event>& out);

  // Cancels every choice (the client went away), or one (it hit a stop string).
  void cancel() { all_cancelled_.store(true, std::memory_order_relaxed); }
  void cancel(int choice);
  bool cancelled() const { return all_cancelled_.load(std::memory_order_relaxed); }
  bool cancelled(int choice) const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::vector<int> cancelled_choices_;
  std::atomic<bool> all_cancelled_{false};
};

}  // namespace deltaflow::engine
