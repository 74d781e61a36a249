#include "engine/generate.hpp"

#include <algorithm>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/sequence_stepper.hpp"
#ifdef DELTAFLOW_HAVE_CUDA
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/device.hpp"
#include "backend/cuda/tp_backend.hpp"
#endif

namespace deltaflow::engine {

LoadLimits load_limits(const SchedulerOptions& engine) {
  LoadLimits limits;
  limits.max_sequences = engine.max_num_seqs;
  limits.max_context = engine.max_model_len;
  limits.max_step_tokens = engine.max_num_batched_tokens;
  limits.kv_cache_dtype = engine.kv_cache_dtype;
  limits.mtp = engine.speculative_tokens > 0;
  return limits;
}

core::Expected<std::unique_ptr<backend::Backend>> load_backend(const std::string& dir, Device device,
                                                               int tensor_parallel,
                                                               const LoadLimits& limits) {
  if (tensor_parallel > 1 && device == Device::kCpu)
    return core::Error{"tensor parallelism needs --device cuda: the CPU backend runs on one device"};
#ifdef DELTAFLOW_HAVE_CUDA
  if (limits.emulate_activation_quant && (tensor_parallel > 1 || device != Device::kCpu))
    return core::Error{"--emulate-activation-quant: CPU only (give --device cpu)"};
  const bool on_gpu = tensor_parallel > 1 || device == Device::kCuda ||
                      (device == Device::kAuto && !backend::cuda::list_devices().empty());
  if (on_gpu && tensor_parallel > 1 && limits.kv_cache_dtype == backend::KvCacheDtype::kFp8)
    return core::Error{"--kv-cache-dtype fp8: not with tensor parallelism yet (one GPU has bf16 and fp8)"};
  backend::cuda::CudaOptions opt;
  // CUDA's own KV cache is bf16 (auto and bf16 alike); fp8 stores E4M3 codes and a scale per row.
  opt.kv_fp8 = limits.kv_cache_dtype == backend::KvCacheDtype::kFp8;
  opt.progress = true;
  opt.max_sequences = limits.max_sequences;
  opt.max_context = limits.max_context;
  opt.mtp = limits.mtp;
  // A pass holds a whole step (cuda_step.cpp fuses a step's runs when it fits).
  opt.prefill_chunk = std::max<int64_t>(opt.prefill_chunk, limits.max_step_tokens);
  if (tensor_parallel > 1) {
    backend::cuda::TpOptions tp;
    tp.world = tensor_parallel;
    DF_ASSIGN(auto b, backend::cuda::TpBackend::load(dir, opt, tp));
    return std::unique_ptr<backend::Backend>(std::make_unique<backend::SequenceStepper>(std::move(b)));
  }
  if (device == Device::kCuda || (device == Device::kAuto && !backend::cuda::list_devices().empty())) {
    opt.engine_pools = true;  // the engine's pools: paged KV, state copies, the prefix cache
    DF_ASSIGN(auto cuda, backend::cuda::CudaBackend::load(dir, opt));
    return std::unique_ptr<backend::Backend>(std::make_unique<backend::SequenceStepper>(std::move(cuda)));
  }
#else
  (void)limits;
  if (tensor_parallel > 1)
    return core::Error{
        "tensor parallelism: this build has no CUDA backend (configure with -DDELTAFLOW_CUDA=ON)"};
  if (device == Device::kCuda)
    return core::Error{"--device cuda: this build has no CUDA backend (configure with -DDELTAFLOW_CUDA=ON)"};
#endif
  backend::cpu::CpuOptions cpu_opt;
  cpu_opt.kv_cache_dtype = limits.kv_cache_dtype;
  cpu_opt.emulate_activation_quant = limits.emulate_activation_quant;
  DF_ASSIGN(auto cpu, backend::cpu::CpuBackend::load(dir, cpu_opt));
  return std::unique_ptr<backend::Backend>(std::move(cpu));
}

namespace {

// Waits for the request's events; on_event sees each, returning false to cancel.
core::Status drain(const std::shared_ptr<ResponseChannel>& ch,
                   const std::function<bool(const Event&)>& on_event) {
  std::vector<Event> events;
  for (;;) {
    if (!ch->wait(std::chrono::milliseconds(200), events)) continue;
    for (const Event& e : events) {
      if (!on_event(e)) ch->cancel();
      if (e.finished) {
        if (e.finish == FinishReason::kError) return core::Error{e.error};
        return core::Status();
      }
    }
  }
}

core::Status submit_one(Scheduler& s, GenerationRequest r) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(r));
  switch (s.submit(std::move(one))) {
    case SubmitResult::kQueued:
      return core::Status();
    case SubmitResult::kQueueFull:
      return core::Error{"the engine's queue is full"};
    case SubmitResult::kStopped:
      return core::Error{"the engine has stopped"};
  }
  return core::Error{"unreachable"};
}

}  // namespace

core::Expected<GenerateResult> generate(Scheduler& s, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& opt,
                                        const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) return core::Error{"the prompt is empty"};
  GenerateResult r;
  r.finish_reason = "length";
  if (opt.max_tokens <= 0) return r;
  GenerationRequest req;
  req.prompt = prompt;
  req.sampling = opt.sampling;
  req.max_tokens = opt.max_tokens;
  req.stop_ids = opt.stop_ids;
  req.message_ends = opt.message_ends;
  req.channel = std::make_shared<ResponseChannel>();
  auto ch = req.channel;
  DF_TRY(submit_one(s, std::move(req)));
  bool stopped_by_caller = false;
  DF_TRY(drain(ch, [&](const Event& e) {
    bool go_on = !stopped_by_caller;
    for (const auto& t : e.tokens) {
      if (stopped_by_caller) break;
      r.ids.push_back(t.id);
      if (on_token && !on_token(t.id)) stopped_by_caller = true, go_on = false;
    }
    if (e.finished) {
      r.cached_tokens = e.cached_tokens;
      r.drafted_tokens = e.drafted_tokens;
      r.accepted_tokens = e.accepted_tokens;
      r.finish_reason = stopped_by_caller || e.finish == FinishReason::kStop ? "stop" : "length";
    }
    return go_on;
  }));
  if (stopped_by_caller) r.finish_reason = "stop";
  return r;
}

core::Expected<std::vector<ScoreResult>> score_all(Scheduler& s,
                                                   const std::vector<std::vector<int32_t>>& seqs, int top_k,
                                                   ScoreError* why,
                                                   std::span<const std::vector<ImageInput>> images) {
  if (!images.empty() && images.size() != seqs.size())
    return core::Error{"scoring: " + std::to_string(images.size()) + " image lists for " +
                       std::to_string(seqs.size()) + " sequences"};
  std::vector<GenerationRequest> reqs;
  auto ch = std::make_shared<ResponseChannel>();
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].size() < 2) return core::Error{"scoring needs at least 2 ids"};
    GenerationRequest req;
    req.prompt = seqs[i];
    req.max_tokens = 0;
    req.prompt_logprobs = true;
    req.prompt_top_logprobs = top_k;
    req.channel = ch;
    req.choice = static_cast<int>(i);
    if (!images.empty()) req.images = images[i];
    reqs.push_back(std::move(req));
  }
  std::vector<ScoreResult> out(seqs.size());
  // In slices the queue holds.
  for (size_t b = 0; b < reqs.size();) {
    std::vector<GenerationRequest> slice;
    const size_t e = std::min(reqs.size(), b + 64);
    for (size_t i = b; i < e; ++i) slice.push_back(std::move(reqs[i]));
    switch (s.submit(std::move(slice))) {
      case SubmitResult::kQueued:
        break;
      case SubmitResult::kQueueFull:
        if (why) why->queue_full = true;
        return core::Error{"the engine's queue is full"};
      case SubmitResult::kStopped:
        if (why) why->stopped = true;
        return core::Error{"the engine has stopped"};
    }
    size_t done = 0;
    std::vector<Event> events;
    while (done < e - b) {
      if (!ch->wait(std::chrono::milliseconds(200), events)) continue;
      for (const Event& ev : events) {
        if (!ev.finished) continue;
        if (ev.finish == FinishReason::kError) return core::Error{ev.error};
        ScoreResult& r = out[static_cast<size_t>(ev.choice)];
        for (double lp : ev.prompt_logprobs) {
          r.logprobs.push_back(lp);
          r.nll -= lp;
        }
        r.top = ev.prompt_top;
        r.ranks = ev.prompt_ranks;
        ++done;
      }
    }
    b = e;
  }
  for (size_t i = 0; i < seqs.size(); ++i)
    if (out[i].logprobs.size() + 1 != seqs[i].size())
      return core::Error{"scoring returned " + std::to_string(out[i].logprobs.size()) +
                         " log-probabilities for " + std::to_string(seqs[i].size()) + " ids"};
  return out;
}

core::Expected<ScoreResult> score(Scheduler& s, const std::vector<int32_t>& ids) {
  DF_ASSIGN(auto all, score_all(s, {ids}, -1));
  return std::move(all[0]);
}

}  // namespace deltaflow::engine
