// Opening a backend, and blocking single-request generation and teacher-forced scoring through a running
// Scheduler (the CLI's generate, eval and chat: the same engine path as the server).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "engine/sampler.hpp"
#include "engine/scheduler.hpp"

namespace deltaflow::engine {

enum class Device { kAuto, kCpu, kCuda };

// Sequences and positions a backend that keeps each sequence's memory itself (CUDA today) is loaded for.
struct LoadLimits {
  int max_sequences = 16;
  int64_t max_context = 0;      // 0: the backend's default
  int64_t max_step_tokens = 0;  // tokens one engine step carries (a CUDA pass holds at least this many rows)
  backend::KvCacheDtype kv_cache_dtype = backend::KvCacheDtype::kAuto;
  // CPU only: static FP8 activation quantization where the checkpoint stores input scales
  // (backend::cpu::CpuOptions::emulate_activation_quant).
  bool emulate_activation_quant = false;
  // Speculative decoding (--speculative-tokens): the CUDA backend uploads the checkpoint's MTP head too.
  bool mtp = false;
};

// What the engine's options ask of the backend it runs on: its sequences, length, step rows, KV dtype and
// whether it drafts (serve and the CLI commands open their backends with this).
LoadLimits load_limits(const SchedulerOptions& engine);

// Loads DIR on the requested device (auto: CUDA when built with it and a GPU is present, else CPU).
// tensor_parallel > 1: over that many GPUs (backend/cuda/tp_backend.hpp); needs CUDA.
core::Expected<std::unique_ptr<backend::Backend>> load_backend(const std::string& dir, Device device,
                                                               int tensor_parallel = 1,
                                                               const LoadLimits& limits = {});

struct GenerateOptions {
  int max_tokens = 32;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;      // generation ends after emitting one of these
  std::vector<int64_t> message_ends;  // prefix-cache checkpoints (GenerationRequest::message_ends)
};

struct GenerateResult {
  std::vector<int32_t> ids;                         // generated ids (a final stop id included)
  std::string finish_reason;                        // "stop" or "length"
  int64_t cached_tokens = 0;                        // prompt tokens reused from the prefix cache
  int64_t drafted_tokens = 0, accepted_tokens = 0;  // speculative decoding (Event)
};

// Submits one request and waits for it. on_token is called with each id as it arrives; returning false
// cancels the request (finish_reason "stop").
core::Expected<GenerateResult> generate(Scheduler& s, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& opt,
                                        const std::function<bool(int32_t)>& on_token = nullptr);

struct ScoreResult {
  std::vector<double> logprobs;                // entry i = log p(ids[i+1] | ids[0..i])
  double nll = 0;                              // -sum(logprobs), nats
  std::vector<std::vector<TokenLogprob>> top;  // top_k >= 0: entry i = the top_k most likely ids there
  std::vector<int64_t> ranks;                  // top_k >= 0: entry i = 1 + ids scoring above ids[i+1]
};

// Teacher-forced log-probabilities of ids[1..] given the preceding ids.
core::Expected<ScoreResult> score(Scheduler& s, const std::vector<int32_t>& ids);
// Several sequences at once (they share the engine's steps); results in input order. top_k >= 0: also the
// top_k alternatives and the ranks. `why` says whether a failure was a full queue or a stopped engine (a 429
// or a 503 at the HTTP edge). `images`: empty, or each sequence's images (its placeholders expanded), so that
// image prompts are scored as they are generated from.
struct ScoreError {
  bool queue_full = false, stopped = false;
};
core::Expected<std::vector<ScoreResult>> score_all(Scheduler& s,
                                                   const std::vector<std::vector<int32_t>>& seqs,
                                                   int top_k = -1, ScoreError* why = nullptr,
                                                   std::span<const std::vector<ImageInput>> images = {});

}  // namespace deltaflow::engine
