// The engine thread (docs/architecture.md §4): owns the backend and the memory it allocated, takes
// GenerationRequests from a bounded queue, and runs continuous batching. Each step carries every running
// sequence's next token (decode rows) and, in the token budget left, chunks of prompts (the oldest first),
// admitting waiting requests first come first served while state slots and KV pages allow. A step's draws,
// stop tokens, thinking budgets and finishes are pushed to each request's ResponseChannel. When the pages run
// out, prefix-cache checkpoints go first, then the youngest running sequence is preempted and later
// recomputed (its tokens so far become its prompt; the draws, keyed by (seed, step), stay the same). It never
// sees HTTP or JSON.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "backend/backend.hpp"
#include "engine/kv_pages.hpp"
#include "engine/prefix_cache.hpp"
#include "engine/request.hpp"

namespace deltaflow::engine {

// One engine step, as the serving benchmark sees it.
struct StepInfo {
  double seconds = 0;        // the backend's step call
  int64_t decode_rows = 0;   // runs of one token at a position > 0
  int64_t prefill_rows = 0;  // rows of prompt chunks
  int64_t seqs = 0;
  int64_t kv_positions = 0;  // cache positions the decode rows' attention reads
  int64_t draft_rows = 0;    // drafted tokens verified in this step (rows after a decode row)
  double draft_seconds = 0;  // the backend's draft call after the step (speculative decoding)
};

struct SchedulerOptions {
  size_t max_queue = 256;                 // requests waiting (running ones not counted); more are refused
  int64_t max_model_len = 0;              // prompt + generated tokens at most; 0: the backend's max context
  int32_t max_num_seqs = 16;              // sequences running at once
  int64_t max_num_batched_tokens = 2048;  // tokens one step carries (decode rows + prefill chunks)
  // KV memory for the running sequences; 0: enough for max_num_seqs sequences of max_model_len (at most
  // kDefaultKvCacheBytes, 4 GiB, in pool_plan.hpp; fewer pages only mean earlier preemption).
  double kv_cache_gb = 0;
  bool prefix_cache = true;
  double prefix_cache_gb = 1.0;  // checkpoints' state slots + KV pages only the cache holds
  std::function<void(const StepInfo&)> on_step =
      nullptr;  // called on the engine thread after each step (benchmarks)
  // Speculative decoding with the checkpoint's MTP head: up to this many drafted tokens per sequence and
  // step, verified by the next step (0: off; at most kMaxSpeculativeTokens). Each sequence adapts its own
  // count to how often its drafts are accepted (docs/architecture.md §4).
  int32_t speculative_tokens = 0;
  // Benchmarks only (bench --accept-rates): draft position k is accepted in a fraction forced_acceptance[k]
  // of verification steps, whatever the model draws (each position given the one before it: p_k / p_{k-1};
  // non-increasing, in [0, 1]; positions past the list are never accepted). An accepted position emits its
  // draft, a rejected one the model's draw (the next token id if the draw equals the draft), so verify and
  // draft steps can be timed at a fixed profile on weights that accept nothing by themselves. The tokens are
  // then not the model's. Empty: the model's own acceptance.
  std::vector<double> forced_acceptance = {};
  // Speculation turns itself off for good when it does not pay: when the decode steps that verify drafts,
  // their draft calls included, cost kSpeculationOffRatio times as much per emitted token as the plain
  // decode steps or more (one in
  // kSpeculationProbeSteps decode steps is made plain to measure them), over kSpeculationMinSamples
  // verification steps or more (a model too small for it on a GPU, where every step is launch-bound). Not
  // with forced_acceptance, whose profile is meant to be timed.
  bool speculation_auto_off = true;
  // A step's cost for that comparison; null: its measured seconds, the draft call's included (tests give a
  // cost model of their own).
  std::function<double(const StepInfo&)> step_cost = nullptr;
  // The KV cache's storage, a backend load option (LoadLimits) carried here with the engine's flags.
  backend::KvCacheDtype kv_cache_dtype = backend::KvCacheDtype::kAuto;
};

inline constexpr int32_t kMaxSpeculativeTokens = 8;
inline constexpr int64_t kSpeculationProbeSteps = 64;
inline constexpr int64_t kSpeculationMinSamples = 32;
// How much more per token drafting must cost to be turned off (timings are noisy; a near tie keeps it).
inline constexpr double kSpeculationOffRatio = 1.25;

// What the engine holds now (for /metrics).
struct SchedulerStats {
  int64_t running = 0, waiting = 0;
  int64_t kv_pages_used = 0, kv_pages_total = 0;
  int64_t kv_pages_cache_only = 0;  // of kv_pages_used, held by the prefix cache alone
  int64_t state_slots_used = 0, state_slots_total = 0;
  int64_t prefix_checkpoints = 0, prefix_cache_bytes = 0;
  int64_t prefix_hit_tokens = 0;  // prompt tokens served from the cache, since start
  int64_t prefix_evictions = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;
  // Speculative decoding, since start: drafts verified and accepted at each draft position (index 0: the
  // first drafted token of a step).
  std::vector<int64_t> drafted_at, accepted_at;
  // SchedulerOptions::speculation_auto_off: whether it turned speculation off, and the costs per emitted
  // token (decayed means, the step_cost's unit) it compared.
  bool speculation_off = false;
  double speculative_cost_per_token = 0, plain_cost_per_token = 0;
};

enum class SubmitResult { kQueued, kQueueFull, kStopped };

class Scheduler {
 public:
  // Allocates the backend's pools and starts the engine thread. The backend must outlive the scheduler.
  static core::Expected<std::unique_ptr<Scheduler>> start(backend::Backend& backend,
                                                          const SchedulerOptions& o);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues all the requests or none (a full queue, or a stopped scheduler). Each must have a channel.
  SubmitResult submit(std::vector<GenerationRequest> requests);

  size_t waiting() const;
  SchedulerStats stats() const;
  int64_t max_model_len() const { return max_model_len_; }

  // Finishes the running requests as cancelled, fails the waiting ones, and joins the thread.
  void stop();
  // Finishes every request, running, waiting or submitted from now on, as aborted (a clean final event
  // with finish reason "abort"); the engine keeps running. The server's drain ends with it.
  void abort_all();

 private:
  struct Sequence;
  Scheduler(backend::Backend& backend, const SchedulerOptions& o);
  core::Status plan();
  void run();
  // The image encoder's thread (started with the first request that has images): encodes the images of the
  // sequences in to_encode_ while the engine thread keeps stepping the others, and hands them back through
  // encoded_. The backend's encode_images runs there, concurrently with step().
  void run_encoder();
  void stop_encoder();
  // One step: admission, the batch, the backend, the draws. False when there was nothing to do.
  bool step_once();
  void take_new_requests();
  bool admit(Sequence& s);
  bool reserve_pages(Sequence& s, int64_t end);
  // Whether s, just admitted, may join the running sequences: the pages its whole known length still needs,
  // beside those the running ones still need for theirs, and a reserve of 1% of the pool for their growth,
  // are free (evicting prefix-cache checkpoints for them).
  bool fits_beside_running(const Sequence& s);
  // SchedulerOptions::forced_acceptance: the token verification emits at draft position j of s instead of
  // the model's draw.
  int32_t forced_draw(const Sequence& s, int64_t j, int32_t drawn);
  bool preempt_youngest(const Sequence* keep);
  void release(Sequence& s, bool to_cache);
  // Pushes the final event (with `last` as its last token, if any) and frees the sequence's memory (its
  // state kept as a prefix-cache checkpoint unless it failed).
  void finish(Sequence& s, FinishReason why, const std::string& error = {},
              std::optional<SampledToken> last = std::nullopt, int32_t stop_id = -1);
  void emit(Sequence& s, int32_t id, const float* row);
  // Speculative decoding: the draws of a verification run (its drafted tokens accepted while they equal the
  // draws), then the MTP head's drafts for the next step.
  void verify(Sequence& s, const float* rows);
  void draft(std::span<Sequence* const> batch, std::span<const backend::SeqRun> runs);
  int32_t draft_count(const Sequence& s) const;
  // SchedulerOptions::speculation_auto_off: one decode step's cost and the tokens it emitted.
  void weigh_speculation(const StepInfo& info, int64_t emitted);
  std::optional<int32_t> take_slot(const Checkpoint* keep);
  void publish_stats();
  std::string check_request(const GenerationRequest& r) const;

  backend::Backend& backend_;
  SchedulerOptions opt_;
  int64_t max_model_len_ = 0;
  bool len_from_pages_ = false;  // max_model_len_ is what the KV pool holds, less than asked
  int32_t page_size_ = 16;
  bool use_cache_ = false;

  // Engine thread only.
  KvPages pages_;
  StateSlots slots_;
  std::unique_ptr<PrefixCache> cache_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  std::deque<std::unique_ptr<Sequence>> waiting_;   // arrival order; preempted ones go back to the front
  uint64_t next_order_ = 0;
  std::vector<float> work_;              // host sampling scratch
  std::mt19937_64 forced_rng_{0x5eedu};  // SchedulerOptions::forced_acceptance's draws
  // speculation_auto_off: decayed cost and tokens of verification and plain decode steps, their counts, the
  // decode steps since the last plain one, whether the next draft call drafts nothing (a probe), and off.
  double spec_cost_ = 0, spec_tokens_ = 0, plain_cost_ = 0, plain_tokens_ = 0;
  int64_t spec_samples_ = 0, plain_samples_ = 0, since_plain_ = 0;
  bool probe_plain_ = false, spec_off_ = false;
  int64_t encoding_ = 0;  // sequences handed to the encoder thread and not yet back
  std::thread encoder_;   // started and joined by the engine thread

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationRequest> queue_;  // submitted, not yet taken by the engine thread
  std::condition_variable encode_cv_;
  std::deque<std::unique_ptr<Sequence>> to_encode_;  // waiting for the encoder thread
  std::deque<std::unique_ptr<Sequence>> encoded_;    // back from it, for the engine thread to take
  bool encoder_stop_ = false;
  bool stopping_ = false;
  std::atomic<bool> stop_now_{false};
  std::atomic<bool> abort_now_{false};
  SchedulerStats stats_;  // under mu_
  int64_t hit_tokens_ = 0, preemptions_ = 0, steps_ = 0;
  std::vector<int64_t> drafted_at_, accepted_at_;  // engine thread; published in stats_
  std::thread thread_;
};

}  // namespace deltaflow::engine
