#include "engine/scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <exception>

#include "backend/host_sampling.hpp"
#include "engine/constraint.hpp"
#include "engine/pool_plan.hpp"
#include "engine/sampling_state.hpp"

namespace deltaflow::engine {

// A request the engine holds: waiting, or running with a state slot and KV pages.
struct Scheduler::Sequence {
  GenerationRequest req;
  std::vector<int32_t> tokens;  // the prompt, then every generated token
  int64_t prompt_len = 0;
  int64_t computed = 0;  // tokens whose KV and recurrent state the slot holds
  int32_t slot = -1;
  std::vector<int32_t> pages;  // block table
  SamplingState sampling;
  int64_t generated = 0;
  int64_t cached = 0;  // prompt tokens reused from the prefix cache
  std::deque<int32_t> forced;
  bool in_thought = false, closing = false;
  int thought_tokens = 0;
  uint64_t order = 0;  // arrival
  bool done = false;   // finished this step (removed from running_ at its end)
  std::vector<double> prompt_lp;
  std::vector<uint32_t> mask;  // structured outputs: the constraint's allowed ids
  std::vector<float> masked;
  std::vector<std::vector<TokenLogprob>> prompt_top;
  std::vector<int64_t> prompt_ranks;
  // Speculative decoding: tokens the MTP head drafted after tokens.back(), verified by the next step; the
  // sequence's draft length (adapted to its acceptance) and its decayed counts of accepted and tried drafts.
  std::vector<int32_t> drafts;
  int32_t max_drafts = 0;                        // the request's ceiling (0: off)
  double accept_weight = 1.4, try_weight = 2.0;  // a prior of 70% acceptance, worth two tries
  int32_t plain_steps = 0;                       // decode steps without drafts since the last probe
  int64_t drafted = 0, accepted = 0;
  // This step.
  int64_t chunk = 0;
  std::vector<backend::StateSnapshot> snaps;
  bool verifying = false;  // this step's run is [tokens.back(), drafts...] with a snapshot after each row
  int32_t checking_draft = -1;  // the draft the token being emitted is checked against (finish() counts it)
  int32_t last_id = -1;         // the last token emit() gave out
  // Images in the prompt (null: text only): encoder rows, M-RoPE positions, prefix-cache keys.
  std::unique_ptr<ImagePrompt> images;
  std::string encode_error;     // the encoder thread's failure, reported by the engine thread
  bool encode_skipped = false;  // cancelled before the encoder reached it
  // What the prefix cache knows this sequence's tokens by.
  std::span<const int32_t> keys() const { return images ? images->keys() : std::span<const int32_t>(tokens); }
};

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

Event final_event(int choice, FinishReason why) {
  Event e;
  e.choice = choice;
  e.finished = true;
  e.finish = why;
  return e;
}

}  // namespace

core::Expected<std::unique_ptr<Scheduler>> Scheduler::start(backend::Backend& backend,
                                                            const SchedulerOptions& o) {
  std::unique_ptr<Scheduler> s(new Scheduler(backend, o));
  DF_TRY(s->plan());
  s->thread_ = std::thread([p = s.get()] { p->run(); });
  return s;
}

Scheduler::Scheduler(backend::Backend& backend, const SchedulerOptions& o) : backend_(backend), opt_(o) {}

Scheduler::~Scheduler() {
  stop();
}

// The memory plan (pool_plan.hpp): pages and state slots for the running sequences, and the prefix cache's
// share of --prefix-cache-gb.
core::Status Scheduler::plan() {
  const auto& c = backend_.config();
  if (opt_.speculative_tokens > 0 && !backend_.can_draft())
    return core::Error{
        std::string("--speculative-tokens: the ") + backend_.name() +
        " backend cannot draft with this checkpoint (it needs the checkpoint's MTP head, mtp.*, "
        "and a backend that runs it: cpu, or cuda without tensor parallelism)"};
  const auto& fa = opt_.forced_acceptance;
  if (!fa.empty() && opt_.speculative_tokens <= 0)
    return core::Error{"--accept-rates needs --speculative-tokens K (1.." +
                       std::to_string(kMaxSpeculativeTokens) + ")"};
  for (size_t k = 0; k < fa.size(); ++k)
    if (!(fa[k] >= 0.0 && fa[k] <= 1.0) || (k > 0 && fa[k] > fa[k - 1]))
      return core::Error{"--accept-rates: position " + std::to_string(k + 1) +
                         "'s rate must be in [0, 1] and at most the one before it"};
  PoolGeometry g;
  g.model_len = opt_.max_model_len > 0 ? opt_.max_model_len : c.max_position_embeddings;
  // The backend's own cap (CUDA: the context it planned its workspace for) bounds the default KV budget.
  if (backend_.pools().max_context > 0) g.model_len = std::min(g.model_len, backend_.pools().max_context);
  g.page_size = backend_.page_size();
  g.page_bytes = backend_.page_bytes() + (opt_.speculative_tokens > 0 ? backend_.draft_page_bytes() : 0);
  g.slot_bytes = backend_.slot_bytes();
  g.paged = backend_.pools().paged;
  DF_ASSIGN(PoolPlan plan, plan_pools(opt_, g));
  backend::PoolRequest req;
  req.draft = opt_.speculative_tokens > 0;
  req.kv_pages = plan.kv_pages();
  req.state_slots = plan.state_slots();
  req.max_step_rows = opt_.max_num_batched_tokens;
  req.max_step_seqs = opt_.max_num_seqs;
  DF_TRY(backend_.allocate(req));
  const auto& pools = backend_.pools();
  page_size_ = pools.page_size;
  max_model_len_ = std::min<int64_t>(g.model_len, pools.max_context);
  len_from_pages_ = pools.max_context < g.model_len && pools.max_context >= pools.kv_pages * page_size_;
  pages_ = KvPages(pools.kv_pages);
  slots_ = StateSlots(pools.state_slots);
  use_cache_ = plan.prefix_cache;
  if (use_cache_) {
    PrefixCache::Budget b;
    b.max_bytes = static_cast<size_t>(opt_.prefix_cache_gb * (1ull << 30));
    b.page_bytes = std::max<size_t>(g.page_bytes, 1);
    b.slot_bytes = std::max<size_t>(g.slot_bytes, 1);
    b.page_size = page_size_;
    cache_ = std::make_unique<PrefixCache>(pages_, slots_, b);
  }
  publish_stats();
  return core::Status();
}

SubmitResult Scheduler::submit(std::vector<GenerationRequest> requests) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return SubmitResult::kStopped;
    // Requests whose clients left while they waited give their places up now.
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->channel->cancelled(it->choice)) {
        Event e = final_event(it->choice, FinishReason::kCancelled);
        e.prompt_tokens = static_cast<int64_t>(it->prompt.size());
        it->channel->push(std::move(e));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    if (queue_.size() + static_cast<size_t>(stats_.waiting) + requests.size() > opt_.max_queue)
      return SubmitResult::kQueueFull;
    for (auto& r : requests) queue_.push_back(std::move(r));
  }
  cv_.notify_one();
  return SubmitResult::kQueued;
}

size_t Scheduler::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + static_cast<size_t>(stats_.waiting);
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  s.waiting += static_cast<int64_t>(queue_.size());
  return s;
}

void Scheduler::publish_stats() {
  SchedulerStats s;
  s.running = static_cast<int64_t>(running_.size());
  s.waiting = static_cast<int64_t>(waiting_.size()) + encoding_;
  s.kv_pages_used = pages_.used();
  s.kv_pages_total = pages_.total();
  s.kv_pages_cache_only = pages_.cache_only();
  s.state_slots_used = slots_.used();
  s.state_slots_total = slots_.total();
  if (cache_) {
    s.prefix_checkpoints = cache_->checkpoints();
    s.prefix_cache_bytes = static_cast<int64_t>(cache_->bytes());
    s.prefix_evictions = cache_->evictions();
  }
  s.prefix_hit_tokens = hit_tokens_;
  s.preemptions = preemptions_;
  s.steps = steps_;
  s.drafted_at = drafted_at_;
  s.accepted_at = accepted_at_;
  s.speculation_off = spec_off_;
  s.speculative_cost_per_token = spec_tokens_ > 0 ? spec_cost_ / spec_tokens_ : 0;
  s.plain_cost_per_token = plain_tokens_ > 0 ? plain_cost_ / plain_tokens_ : 0;
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = s;
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
    Event e = final_event(r.choice, FinishReason::kError);
    e.error = "the server is shutting down";
    if (r.channel) r.channel->push(std::move(e));
  }
}

void Scheduler::abort_all() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_now_.store(true);
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------------------------
// The engine thread

void Scheduler::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!stopping_ && queue_.empty() && encoded_.empty() && running_.empty() && waiting_.empty())
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !encoded_.empty(); });
      if (stopping_) break;
    }
    try {
      step_once();
    } catch (const std::exception& ex) {
      // A backend that throws (allocation failure) fails the sequences of this step, not the process.
      for (auto& s : running_) {
        for (const auto& sn : s->snaps) slots_.give_back(sn.slot);  // this step's snapshot slots
        s->snaps.clear();
        finish(*s, FinishReason::kError, std::string("engine failure: ") + ex.what());
      }
      running_.clear();
    }
    publish_stats();
  }
  stop_encoder();
  for (auto& s : running_) finish(*s, FinishReason::kCancelled);
  running_.clear();
  for (auto& s : waiting_) finish(*s, FinishReason::kError, "the server is shutting down");
  waiting_.clear();
  publish_stats();
}

void Scheduler::run_encoder() {
  for (;;) {
    std::unique_ptr<Sequence> s;
    {
      std::unique_lock<std::mutex> lock(mu_);
      encode_cv_.wait(lock, [&] { return encoder_stop_ || !to_encode_.empty(); });
      if (encoder_stop_) return;
      s = std::move(to_encode_.front());
      to_encode_.pop_front();
    }
    if (s->req.channel->cancelled(s->req.choice)) {
      s->encode_skipped = true;
    } else {
      // An encoder that throws (allocation failure) fails this request, not the others.
      core::Expected<ImagePrompt> ip = core::Error{"images: the encoder failed"};
      try {
        ip = ImagePrompt::make(backend_, s->tokens, s->req.images);
      } catch (const std::exception& ex) {
        ip = core::Error{std::string("images: the encoder failed: ") + ex.what()};
      }
      if (ip.is_ok()) {
        s->images = std::make_unique<ImagePrompt>(std::move(ip).value());
        s->req.images.clear();  // the encoder's rows are all the sequence needs now
      } else {
        s->encode_error = ip.message();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      encoded_.push_back(std::move(s));
    }
    cv_.notify_all();
  }
}

void Scheduler::stop_encoder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    encoder_stop_ = true;
  }
  encode_cv_.notify_all();
  if (encoder_.joinable()) encoder_.join();
  // The encoder has stopped: what it held or gave back is the engine thread's now.
  std::deque<std::unique_ptr<Sequence>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(to_encode_);
    for (auto& s : encoded_) left.push_back(std::move(s));
    encoded_.clear();
  }
  for (auto& s : left) finish(*s, FinishReason::kError, "the server is shutting down");
  encoding_ = 0;
}

std::string Scheduler::check_request(const GenerationRequest& r) const {
  // The HTTP side validates all of this with better messages; these checks keep the engine safe on its own.
  const int64_t vocab = backend_.config().vocab_size;
  if (r.prompt.empty()) return "the prompt is empty";
  for (const auto* ids : {&r.prompt, &r.forced_ids, &r.thinking.close_ids})
    for (int32_t id : *ids)
      if (id < 0 || id >= vocab)
        return "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) +
               ")";
  if (r.max_tokens < 0) return "max_tokens is negative";
  const int64_t len = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  if (len > max_model_len_)
    return "prompt (" + std::to_string(r.prompt.size()) + " tokens) + max_tokens (" +
           std::to_string(r.max_tokens) + ") exceeds " +
           (len_from_pages_ ? "the " + std::to_string(max_model_len_) +
                                  " positions the KV pages hold (raise --kv-cache-gb)"
                            : "the model length " + std::to_string(max_model_len_));
  if (ceil_div(len, page_size_) > pages_.total())
    return "prompt + max_tokens needs " + std::to_string(ceil_div(len, page_size_)) +
           " KV pages; the pool has " + std::to_string(pages_.total()) + " (raise --kv-cache-gb)";
  return {};
}

void Scheduler::take_new_requests() {
  std::deque<GenerationRequest> fresh;
  std::deque<std::unique_ptr<Sequence>> encoded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh.swap(queue_);
    encoded.swap(encoded_);
    // They wait now: counted at once, so that submit() never sees them in neither place (the step publishes
    // the exact count when it ends).
    stats_.waiting = static_cast<int64_t>(waiting_.size() + fresh.size()) + encoding_;
  }
  // Back from the encoder thread: they join the waiting queue (after the text requests that came while they
  // were encoded), or fail.
  for (auto& s : encoded) {
    --encoding_;
    if (s->encode_skipped) {
      finish(*s, FinishReason::kCancelled);
    } else if (!s->encode_error.empty()) {
      finish(*s, FinishReason::kError, s->encode_error);
    } else {
      s->max_drafts = 0;  // the MTP head drafts at text positions only
      waiting_.push_back(std::move(s));
    }
  }
  for (auto& r : fresh) {
    auto s = std::make_unique<Sequence>();
    s->order = next_order_++;
    s->prompt_len = static_cast<int64_t>(r.prompt.size());
    s->tokens = r.prompt;
    s->sampling = SamplingState(r.sampling);
    s->sampling.add_prompt(r.prompt);
    s->forced.assign(r.forced_ids.begin(), r.forced_ids.end());
    s->in_thought = r.thinking.open_at_start;
    s->max_drafts = r.speculative_tokens < 0 ? opt_.speculative_tokens
                                             : std::min(r.speculative_tokens, opt_.speculative_tokens);
    s->req = std::move(r);
    if (const std::string why = check_request(s->req); !why.empty()) {
      finish(*s, FinishReason::kError, why);
      continue;
    }
    if (!s->req.images.empty()) {
      if (!backend_.vision()) {
        finish(*s, FinishReason::kError, backend_.vision_error());
        continue;
      }
      // Encoded on the encoder thread, so that the running sequences keep stepping meanwhile.
      if (!encoder_.joinable()) encoder_ = std::thread([this] { run_encoder(); });
      ++encoding_;
      {
        std::lock_guard<std::mutex> lock(mu_);
        to_encode_.push_back(std::move(s));
      }
      encode_cv_.notify_one();
      continue;
    }
    waiting_.push_back(std::move(s));
  }
}

std::optional<int32_t> Scheduler::take_slot(const Checkpoint* keep) {
  for (;;) {
    if (auto s = slots_.take()) return s;
    if (!cache_ || !cache_->evict_one(keep)) return std::nullopt;
  }
}

bool Scheduler::reserve_pages(Sequence& s, int64_t end) {
  const int64_t need = ceil_div(end, page_size_);
  while (static_cast<int64_t>(s.pages.size()) < need) {
    auto p = pages_.take();
    while (!p && cache_ && cache_->evict_one()) p = pages_.take();
    if (!p) return false;
    s.pages.push_back(*p);
  }
  return true;
}

bool Scheduler::fits_beside_running(const Sequence& s) {
  const auto still_needs = [&](const Sequence& q) {
    return std::max<int64_t>(0, ceil_div(static_cast<int64_t>(q.tokens.size()), page_size_) -
                                    static_cast<int64_t>(q.pages.size()));
  };
  int64_t need = still_needs(s) + std::max<int64_t>(1, pages_.total() / 100);
  for (const auto& r : running_) need += still_needs(*r);
  while (pages_.free_count() < need && cache_ && cache_->evict_one()) {
  }
  return pages_.free_count() >= need;
}

bool Scheduler::admit(Sequence& s) {
  const Checkpoint* cp = nullptr;
  if (use_cache_ && !s.req.prompt_logprobs)
    cp = cache_->lookup(s.keys(), static_cast<int64_t>(s.tokens.size()) - 1);
  auto slot = take_slot(cp);
  if (!slot) return false;
  s.slot = *slot;
  s.computed = 0;
  if (cp) {
    // Resume from the checkpoint: its state copied, its full pages shared, the page it ends inside copied.
    const int64_t full = cp->depth / page_size_;
    std::vector<int32_t> pages(cp->pages.begin(), cp->pages.begin() + full);
    for (int32_t p : pages) pages_.ref(p);
    std::optional<int32_t> tail;
    if (cp->depth % page_size_ != 0) {
      tail = pages_.take();
      while (!tail && cache_->evict_one(cp)) tail = pages_.take();
    }
    const bool copied =
        (cp->depth % page_size_ == 0 || tail) && backend_.copy_state(cp->slot, s.slot).is_ok() &&
        (!tail ||
         backend_.copy_pages(std::vector<backend::PageCopy>{{cp->pages[static_cast<size_t>(full)], *tail}})
             .is_ok());
    if (copied) {
      s.pages = std::move(pages);
      if (tail) s.pages.push_back(*tail);
      s.computed = cp->depth;
      s.cached = std::max(s.cached, std::min(cp->depth, s.prompt_len));
      hit_tokens_ += cp->depth;
    } else {
      for (int32_t p : pages) pages_.unref(p);
      if (tail) pages_.unref(*tail);
    }
  }
  return true;
}

void Scheduler::release(Sequence& s, bool to_cache) {
  if (s.slot >= 0) {
    const bool kept = to_cache && use_cache_ && s.computed > 0 &&
                      cache_->insert(s.keys().first(static_cast<size_t>(s.computed)), s.slot, s.pages);
    if (!kept) slots_.give_back(s.slot);
    s.slot = -1;
  }
  for (int32_t p : s.pages) pages_.unref(p);
  s.pages.clear();
  s.computed = 0;
  s.drafts.clear();
}

bool Scheduler::preempt_youngest(const Sequence* keep) {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (it->get() == keep) continue;
    std::unique_ptr<Sequence> s = std::move(*it);
    running_.erase(std::next(it).base());
    release(*s, /*to_cache=*/false);
    s->prompt_lp.clear();  // recomputed with the prompt
    s->prompt_top.clear();
    s->prompt_ranks.clear();
    ++preemptions_;
    // Back among the waiting, in arrival order: its tokens so far are recomputed when it is admitted again.
    auto pos =
        std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w->order > s->order; });
    waiting_.insert(pos, std::move(s));
    return true;
  }
  return false;
}

void Scheduler::finish(Sequence& s, FinishReason why, const std::string& error,
                       std::optional<SampledToken> last, int32_t stop_id) {
  Event e = final_event(s.req.choice, why);
  e.error = error;
  if (last) e.tokens.push_back(std::move(*last));  // the last token rides in the final event
  e.stop_id = stop_id;
  e.prompt_tokens = s.prompt_len;
  e.cached_tokens = s.cached;
  e.completion_tokens = s.generated;
  e.prompt_logprobs = std::move(s.prompt_lp);
  e.prompt_top = std::move(s.prompt_top);
  e.prompt_ranks = std::move(s.prompt_ranks);
  e.drafted_tokens = s.drafted;
  e.accepted_tokens = s.accepted + (e.tokens.size() == 1 && e.tokens[0].id == s.checking_draft ? 1 : 0);
  if (s.req.channel) s.req.channel->push(std::move(e));
  release(s, why != FinishReason::kError);
  s.done = true;
}

// The token after the sequence's last computed one: forced, or drawn. Pushes it, and finishes the sequence
// on a stop token or max_tokens; otherwise it becomes the next token to compute.
void Scheduler::emit(Sequence& s, int32_t drawn, const float* row) {
  GenerationRequest& r = s.req;
  if (s.in_thought && !s.closing && r.thinking.max_tokens >= 0 && s.thought_tokens >= r.thinking.max_tokens) {
    s.forced.insert(s.forced.begin(), r.thinking.close_ids.begin(), r.thinking.close_ids.end());
    s.closing = true;
  }
  int32_t id = drawn;
  if (!s.forced.empty()) {
    id = s.forced.front();
    s.forced.pop_front();
  } else if (r.constraint) {
    // Structured outputs: the grammar's mask on the host row, then the reference draw from the masked copy.
    // No allowed id: the output is complete.
    const size_t V = static_cast<size_t>(backend_.config().vocab_size);
    s.mask.resize(TokenConstraint::mask_words(V));
    r.constraint->fill_mask(s.mask);
    if (!row || std::none_of(s.mask.begin(), s.mask.end(), [](uint32_t w) { return w != 0; })) {
      finish(s, FinishReason::kStop);
      return;
    }
    s.masked.assign(row, row + V);
    TokenConstraint::apply_mask(s.mask, s.masked);
    id = backend::sample_row(s.masked, s.sampling.spec(), work_);
  }
  if (r.constraint && !r.constraint->accept(id)) {
    finish(s, FinishReason::kError, "token " + std::to_string(id) + " breaks the grammar");
    return;
  }
  s.sampling.accept(id);
  ++s.generated;
  s.last_id = id;
  SampledToken tok;
  tok.id = id;
  if (r.logprobs && row) {
    const std::span<const float> lr(row, static_cast<size_t>(backend_.config().vocab_size));
    tok.logprob = chosen_logprob(lr, id).logprob;
    tok.top = top_logprobs(lr, r.top_logprobs);
  }
  if (id == r.thinking.start_id && r.thinking.start_id >= 0) {
    s.in_thought = true;
    s.thought_tokens = 0;
  } else if (id == r.thinking.end_id && r.thinking.end_id >= 0) {
    s.in_thought = false;
    s.closing = false;
  } else if (s.in_thought) {
    ++s.thought_tokens;
  }
  const bool is_stop = std::find(r.stop_ids.begin(), r.stop_ids.end(), id) != r.stop_ids.end();
  if (is_stop || s.generated >= r.max_tokens) {
    finish(s, is_stop ? FinishReason::kStop : FinishReason::kLength, {}, std::move(tok), is_stop ? id : -1);
    return;
  }
  Event e;
  e.choice = r.choice;
  e.tokens.push_back(std::move(tok));
  r.channel->push(std::move(e));
  s.tokens.push_back(id);
  if (s.images) s.images->append(id);
}

bool Scheduler::step_once() {
  take_new_requests();
  // Cancelled requests free their slots and pages at once.
  const bool stopping = stop_now_.load(std::memory_order_relaxed);
  const bool aborting = abort_now_.load(std::memory_order_relaxed);
  auto cancelled = [&](const Sequence& s) {
    return stopping || aborting || s.req.channel->cancelled(s.req.choice);
  };
  // Cancelled by the client, or aborted by the server (a clean final event for a client still there).
  auto why = [&](const Sequence& s) {
    return aborting && !stopping && !s.req.channel->cancelled(s.req.choice) ? FinishReason::kAborted
                                                                            : FinishReason::kCancelled;
  };
  for (auto it = running_.begin(); it != running_.end();) {
    if (cancelled(**it)) {
      finish(**it, why(**it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (cancelled(**it)) {
      finish(**it, why(**it));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  if (running_.empty() && waiting_.empty()) return false;

  int64_t budget = opt_.max_num_batched_tokens;
  std::vector<Sequence*> batch;
  // Decode rows first, oldest first: a row that finds no page evicts cache checkpoints, then preempts the
  // youngest running sequence (itself, if it is the youngest).
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i].get();
    if (static_cast<int64_t>(s->tokens.size()) - s->computed != 1) continue;
    bool ok = reserve_pages(*s, s->computed + 1);
    while (!ok && running_.back().get() != s && preempt_youngest(s)) ok = reserve_pages(*s, s->computed + 1);
    if (!ok) {
      preempt_youngest(nullptr);  // s is the youngest: it waits for the others to finish
      break;
    }
    s->chunk = 1;
    --budget;
    // Its drafts ride along, as far as the budget, the pages and a snapshot slot for each allow.
    s->snaps.clear();
    s->verifying = false;
    if (!s->drafts.empty()) {
      size_t keep = std::min(s->drafts.size(), static_cast<size_t>(std::max<int64_t>(budget, 0)));
      if (!reserve_pages(*s, s->computed + 1 + static_cast<int64_t>(keep))) keep = 0;
      for (size_t j = 0; j < keep; ++j) {
        auto slot = take_slot(nullptr);
        if (!slot) break;
        s->snaps.push_back({static_cast<int32_t>(j + 1), *slot});
      }
      s->drafts.resize(s->snaps.size());
      s->verifying = !s->drafts.empty();
      s->chunk += static_cast<int64_t>(s->drafts.size());
      budget -= static_cast<int64_t>(s->drafts.size());
    }
    batch.push_back(s);
  }
  // Prompt chunks of running sequences, then of newly admitted ones, first come first served.
  auto add_chunk = [&](Sequence& s) {
    const int64_t remaining = static_cast<int64_t>(s.tokens.size()) - s.computed;
    // As many tokens as the budget, and the free pages with the sequence's own, hold.
    auto fits = [&] {
      return (static_cast<int64_t>(s.pages.size()) + pages_.free_count()) * page_size_ - s.computed;
    };
    int64_t n = std::min(remaining, budget);
    while (n > fits() && cache_ && cache_->evict_one()) {
    }
    n = std::min(n, fits());
    if (n <= 0 || !reserve_pages(s, s.computed + n)) return false;
    s.chunk = n;
    budget -= n;
    batch.push_back(&s);
    return true;
  };
  for (auto& up : running_) {
    if (budget <= 0) break;
    Sequence& s = *up;
    if (static_cast<int64_t>(s.tokens.size()) - s.computed > 1) add_chunk(s);
  }
  while (!waiting_.empty() && budget > 0 && static_cast<int32_t>(running_.size()) < opt_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    if (!admit(s)) break;
    // Only when its whole length fits beside the running sequences' (the first one always): otherwise a
    // preempted sequence would be readmitted into the pages the decoders are about to take and preempted
    // again, its whole length recomputed each time (measured: a 27B workload of 8K prompts whose KV was 10%
    // short fell from about 900 to about 100 output tok/s).
    if (!running_.empty() && !fits_beside_running(s)) {
      release(s, false);
      break;
    }
    if (!add_chunk(s)) {
      release(s, false);
      break;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  if (batch.empty()) {
    // Nothing fits: the running sequences hold every page. The youngest gives way (recomputed later).
    if (running_.size() > 1) return preempt_youngest(running_.front().get());
    // One sequence alone cannot get pages (the submit check makes this unreachable): fail it, never spin.
    auto& stuck = running_.empty() ? waiting_.front() : running_.front();
    finish(*stuck, FinishReason::kError, "the KV pages ran out for one sequence (raise --kv-cache-gb)");
    if (running_.empty()) {
      waiting_.pop_front();
    } else {
      running_.clear();
    }
    return true;
  }

  {
    // Admissions are known now: the counts submit() reads are right before the step runs.
    std::lock_guard<std::mutex> lock(mu_);
    stats_.waiting = static_cast<int64_t>(waiting_.size());
    stats_.running = static_cast<int64_t>(running_.size());
  }

  // The step.
  std::vector<int32_t> tokens;
  std::vector<backend::SeqRun> runs;
  runs.reserve(batch.size());
  for (Sequence* s : batch) {
    backend::SeqRun run;
    run.first_row = static_cast<int32_t>(tokens.size());
    run.n_rows = static_cast<int32_t>(s->chunk);
    run.start_pos = s->computed;
    run.state_slot = s->slot;
    run.kv_pages = s->pages;
    if (s->verifying) {
      // Verification: the pending token and the drafts after it, every row's logits, drawn here; the
      // snapshots (taken above) hold the state after each row, for the rows that are rejected.
      run.logits = backend::RunLogits::kAll;
      run.sample = nullptr;
      tokens.push_back(s->tokens.back());
      tokens.insert(tokens.end(), s->drafts.begin(), s->drafts.end());
      run.snapshots = s->snaps;
      if (s->images) s->images->fill_run(run.start_pos, run.n_rows, run);
      runs.push_back(run);
      continue;
    }
    const int64_t end = s->computed + s->chunk;
    const bool last = end == static_cast<int64_t>(s->tokens.size());
    const bool in_prompt = s->computed < s->prompt_len;
    // A constrained sequence (structured outputs) draws on the host from the masked row.
    const bool constrained = s->req.constraint != nullptr;
    run.logits = s->req.prompt_logprobs && in_prompt        ? backend::RunLogits::kAll
                 : last && (s->req.logprobs || constrained) ? backend::RunLogits::kLast
                                                            : backend::RunLogits::kNone;
    run.sample = last && s->req.max_tokens > 0 && !constrained ? &s->sampling.spec() : nullptr;
    tokens.insert(tokens.end(), s->tokens.begin() + s->computed, s->tokens.begin() + end);
    // Prefix checkpoints inside this chunk: the end of each rendered message, the prompt's last token but one
    // (a later identical prompt recomputes only its last token), and the chunk's end inside a prompt.
    s->snaps.clear();
    if (use_cache_ && in_prompt && !s->req.prompt_logprobs) {
      std::vector<int64_t> at(s->req.message_ends.begin(), s->req.message_ends.end());
      at.push_back(s->prompt_len - 1);
      if (end < s->prompt_len - 1) at.push_back(end);
      std::sort(at.begin(), at.end());
      at.erase(std::unique(at.begin(), at.end()), at.end());
      for (int64_t p : at) {
        if (p <= s->computed || p > end || p >= s->prompt_len) continue;
        const auto prefix = s->keys().first(static_cast<size_t>(p));
        if (const Checkpoint* have = cache_->lookup(prefix, p); have && have->depth == p) continue;
        auto slot = slots_.take();
        if (!slot) break;  // no free slot: skip (the running sequences' slots come first)
        s->snaps.push_back({static_cast<int32_t>(p - s->computed), *slot});
      }
    }
    run.snapshots = s->snaps;
    if (s->images) s->images->fill_run(run.start_pos, run.n_rows, run);
    runs.push_back(run);
  }
  backend::StepOut out;
  const backend::Step st{tokens, runs};
  const auto t0 = std::chrono::steady_clock::now();
  const core::Status status = backend_.step(st, out);
  ++steps_;
  StepInfo info;
  {
    info.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    info.seqs = static_cast<int64_t>(runs.size());
    for (size_t i = 0; i < runs.size(); ++i) {
      const auto& r = runs[i];
      if (batch[i]->verifying || (r.n_rows == 1 && r.start_pos > 0)) {
        ++info.decode_rows;
        info.draft_rows += r.n_rows - 1;
        info.kv_positions += r.start_pos + 1;
      } else {
        info.prefill_rows += r.n_rows;
      }
    }
  }
  if (!status) {
    for (Sequence* s : batch) {
      for (const auto& sn : s->snaps) slots_.give_back(sn.slot);
      s->snaps.clear();
      s->drafts.clear();
      s->verifying = false;
    }
    for (auto& s : running_) finish(*s, FinishReason::kError, status.message());
    running_.clear();
    return true;
  }

  // The draws, in batch order; logits rows are in run order.
  int64_t generated_before = 0;
  for (const Sequence* s : batch) generated_before += s->generated;
  const size_t V = static_cast<size_t>(backend_.config().vocab_size);
  size_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *batch[i];
    const auto& run = runs[i];
    if (s.verifying) {
      verify(s, out.logits.data() + row * V);
      row += static_cast<size_t>(run.n_rows);
      continue;
    }
    const int64_t start = s.computed;
    s.computed += s.chunk;
    for (const auto& sn : s.snaps) {
      const int64_t depth = start + sn.rows;
      if (!cache_->insert(s.keys().first(static_cast<size_t>(depth)), sn.slot, s.pages))
        slots_.give_back(sn.slot);
    }
    s.snaps.clear();
    const float* last_row = nullptr;
    if (run.logits == backend::RunLogits::kAll) {
      // Teacher forcing: row j predicts token start + j + 1.
      for (int64_t j = 0; j < s.chunk; ++j) {
        const int64_t next = start + j + 1;
        const std::span<const float> lr(out.logits.data() + (row + static_cast<size_t>(j)) * V, V);
        if (next >= s.prompt_len) continue;
        const int32_t want = s.tokens[static_cast<size_t>(next)];
        s.prompt_lp.push_back(log_prob(lr, want));
        if (s.req.prompt_top_logprobs >= 0) {
          s.prompt_top.push_back(top_logprobs(lr, s.req.prompt_top_logprobs));
          s.prompt_ranks.push_back(1 + std::count_if(lr.begin(), lr.end(), [&](float x) {
                                     return x > lr[static_cast<size_t>(want)];
                                   }));
        }
      }
      last_row = out.logits.data() + (row + static_cast<size_t>(s.chunk) - 1) * V;
      row += static_cast<size_t>(s.chunk);
    } else if (run.logits == backend::RunLogits::kLast) {
      last_row = out.logits.data() + row * V;
      row += 1;
    }
    if (s.computed != static_cast<int64_t>(s.tokens.size())) continue;
    if (s.req.max_tokens == 0) {
      finish(s, FinishReason::kLength);  // scoring only (prompt logprobs)
      continue;
    }
    emit(s, out.sampled[i], last_row);
  }
  if (opt_.speculative_tokens > 0 && !spec_off_) {
    const auto t1 = std::chrono::steady_clock::now();
    draft(batch, runs);
    info.draft_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    int64_t emitted = 0;
    for (const Sequence* s : batch) emitted += s->generated;
    weigh_speculation(info, emitted - generated_before);
  }
  if (opt_.on_step) opt_.on_step(info);
  std::erase_if(running_, [](const auto& s) { return s->done; });
  return true;
}

// Row j of the run predicts the token after its input: draw it as a plain decode step would (the same
// (seed, step) key, penalties, grammar and forced tokens, through emit), and go on while the draw equals the
// next drafted token. For a greedy request that is the argmax rule; for a sampled one it accepts draft d with
// probability p(d) and otherwise emits a draw from p without d — the standard rule for a one-hot draft — and
// the tokens are exactly those of decoding without speculation with the same seed. The state after the last
// accepted row is the main slot's (every row accepted) or a snapshot's, which becomes the sequence's slot.
void Scheduler::verify(Sequence& s, const float* rows) {
  const size_t V = static_cast<size_t>(backend_.config().vocab_size);
  const int64_t start = s.computed, n = static_cast<int64_t>(s.drafts.size());
  const int32_t main_slot = s.slot;
  auto slot_after = [&](int64_t r) {
    return r == n + 1 ? main_slot : s.snaps[static_cast<size_t>(r - 1)].slot;
  };
  int64_t used = 0, accepted = 0;  // rows whose inputs the sequence keeps; drafts accepted
  s.drafted += n;
  for (int64_t j = 0; j <= n; ++j) {
    used = j + 1;
    s.computed = start + used;
    s.slot = slot_after(used);  // what finish() keeps if this token ends the sequence
    const float* lr = rows + static_cast<size_t>(j) * V;
    // By the backend's sampler, as a step without drafts would have drawn it.
    auto draw = backend_.draw(std::span<const float>(lr, V), s.sampling.spec());
    if (!draw) {
      finish(s, FinishReason::kError, draw.message());
      break;
    }
    int32_t drawn = *draw;
    if (!opt_.forced_acceptance.empty() && j < n) drawn = forced_draw(s, j, drawn);
    s.checking_draft = j < n ? s.drafts[static_cast<size_t>(j)] : -1;
    s.last_id = -1;
    emit(s, drawn, lr);
    s.checking_draft = -1;
    const bool match = j < n && s.last_id == s.drafts[static_cast<size_t>(j)];
    accepted += match ? 1 : 0;
    if (s.done || !match) break;
    ++s.accepted;  // (a finishing token that matched was counted by finish())
  }
  if (drafted_at_.size() < static_cast<size_t>(n)) {
    drafted_at_.resize(static_cast<size_t>(n));
    accepted_at_.resize(static_cast<size_t>(n));
  }
  for (int64_t k = 0; k < n; ++k) {
    ++drafted_at_[static_cast<size_t>(k)];
    if (k < accepted) ++accepted_at_[static_cast<size_t>(k)];
  }
  // Acceptance: decayed counts of accepted drafts and of tries (a rejection is one more try).
  s.accept_weight = 0.9 * s.accept_weight + static_cast<double>(accepted);
  s.try_weight = 0.9 * s.try_weight + static_cast<double>(accepted + (accepted < n ? 1 : 0));
  // The slots the sequence does not keep go back (finish() has already dealt with the one it kept).
  const int32_t kept = s.done ? -1 : s.slot;
  for (int64_t r = 1; r <= n + 1; ++r)
    if (const int32_t slot = slot_after(r); slot != kept && !(s.done && r == used)) slots_.give_back(slot);
  s.snaps.clear();
  s.drafts.clear();
  s.verifying = false;
}

int32_t Scheduler::forced_draw(const Sequence& s, int64_t j, int32_t drawn) {
  const auto& p = opt_.forced_acceptance;
  const int32_t draft = s.drafts[static_cast<size_t>(j)];
  const size_t k = static_cast<size_t>(j);
  const double given = k == 0 ? 1.0 : p[k - 1];
  const double cond = k < p.size() && given > 0 ? std::min(1.0, p[k] / given) : 0.0;
  if (std::uniform_real_distribution<double>(0.0, 1.0)(forced_rng_) < cond) return draft;
  if (drawn != draft) return drawn;
  return static_cast<int32_t>((draft + 1) % backend_.config().vocab_size);
}

// How many tokens to draft for the sequence's next step: the most k <= its ceiling for which the k-th draft
// is still accepted at least a quarter of the time (acceptance a: a^k >= 0.25), never past max_tokens or the
// model length. A sequence whose drafts stopped paying decodes plainly and tries one draft every 16 steps.
int32_t Scheduler::draft_count(const Sequence& s) const {
  if (s.max_drafts <= 0) return 0;
  // A step verifying k drafts emits up to k + 1 tokens, at positions up to tokens.size() - 1 + k.
  const int64_t room = std::min<int64_t>(s.req.max_tokens - s.generated - 1,
                                         max_model_len_ - static_cast<int64_t>(s.tokens.size()));
  const double a = s.try_weight > 0 ? s.accept_weight / s.try_weight : 0.0;
  int32_t k = 0;
  for (double p = a; k < s.max_drafts && p >= 0.25; p *= a) ++k;
  if (k == 0 && s.plain_steps >= 16) k = 1;
  return static_cast<int32_t>(std::max<int64_t>(0, std::min<int64_t>(k, room)));
}

void Scheduler::weigh_speculation(const StepInfo& info, int64_t emitted) {
  if (!opt_.speculation_auto_off || !opt_.forced_acceptance.empty()) return;
  if (info.prefill_rows > 0 || info.decode_rows == 0 || emitted <= 0) return;  // decode steps only
  const double cost = opt_.step_cost ? opt_.step_cost(info) : info.seconds + info.draft_seconds;
  constexpr double kDecay = 0.95;
  if (info.draft_rows > 0) {
    spec_cost_ = kDecay * spec_cost_ + cost;
    spec_tokens_ = kDecay * spec_tokens_ + static_cast<double>(emitted);
    ++spec_samples_;
    ++since_plain_;
  } else {
    plain_cost_ = kDecay * plain_cost_ + cost;
    plain_tokens_ = kDecay * plain_tokens_ + static_cast<double>(emitted);
    ++plain_samples_;
    since_plain_ = 0;
  }
  // A plain step now and then, and two early on, to measure what speculation is weighed against.
  if (since_plain_ >= kSpeculationProbeSteps ||
      (plain_samples_ < 2 && spec_samples_ >= kSpeculationMinSamples / 2 && since_plain_ > 0))
    probe_plain_ = true;
  if (spec_samples_ >= kSpeculationMinSamples && plain_samples_ >= 2 &&
      spec_cost_ / spec_tokens_ > kSpeculationOffRatio * plain_cost_ / plain_tokens_)
    spec_off_ = true;  // for good: the head no longer runs, so its cache would fall behind
}

// After the step's draws: the MTP head over every run's kept rows, which keeps its KV in step with each
// sequence (prompt chunks included), and drafts for the sequences whose next step is a decode.
void Scheduler::draft(std::span<Sequence* const> batch, std::span<const backend::SeqRun> runs) {
  std::vector<backend::DraftRun> drs;
  std::vector<Sequence*> who;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *batch[i];
    if (s.done) continue;
    const auto& run = runs[i];
    backend::DraftRun d;
    d.first_row = run.first_row;
    d.n_rows = static_cast<int32_t>(s.computed - run.start_pos);
    d.start_pos = run.start_pos;
    d.next_token = s.tokens[static_cast<size_t>(s.computed)];
    const bool decoding = static_cast<int64_t>(s.tokens.size()) - s.computed == 1;
    d.n_draft = decoding && !probe_plain_ ? draft_count(s) : 0;
    if (d.n_draft > 0 && !reserve_pages(s, s.computed + 1 + d.n_draft)) d.n_draft = 0;
    if (decoding) s.plain_steps = d.n_draft > 0 ? 0 : s.plain_steps + 1;
    d.kv_pages = s.pages;
    drs.push_back(d);
    who.push_back(&s);
  }
  probe_plain_ = false;
  if (drs.empty()) return;
  backend::DraftOut out;
  if (!backend_.draft(drs, out)) return;  // no drafts this time: the next steps decode plainly
  size_t at = 0;
  for (size_t i = 0; i < drs.size(); ++i) {
    const auto n = static_cast<size_t>(drs[i].n_draft);
    who[i]->drafts.assign(out.tokens.begin() + static_cast<std::ptrdiff_t>(at),
                          out.tokens.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
}

}  // namespace deltaflow::engine
