// Single-sequence generation and teacher-forced scoring on any backend (the CLI's generate and eval).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "engine/sampler.hpp"

namespace deltaflow::engine {

enum class Device { kAuto, kCpu, kCuda };

// Loads DIR on the requested device (auto: CUDA when built with it and a GPU is present, else CPU).
// tensor_parallel > 1: over that many GPUs (backend/cuda/tp_backend.hpp); needs CUDA.
core::Expected<std::unique_ptr<backend::Backend>> load_backend(const std::string& dir, Device device,
                                                               int tensor_parallel = 1);

struct GenerateOptions {
  int max_tokens = 32;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
};

struct GenerateResult {
  std::vector<int32_t> ids;   // generated ids (a final stop id included)
  std::string finish_reason;  // "stop" or "length"
};

// Prefills the prompt, then decodes. on_token is called with each id as it is sampled; returning false stops.
core::Expected<GenerateResult> generate(backend::Backend& b, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& opt,
                                        const std::function<bool(int32_t)>& on_token = nullptr);

struct ScoreResult {
  std::vector<double> logprobs;  // entry i = log p(ids[i+1] | ids[0..i])
  double nll = 0;                // -sum(logprobs), nats
  std::vector<std::vector<TokenLogprob>> top;  // top_k >= 0: entry i = the top_k most likely ids there
  std::vector<int64_t> ranks;                  // top_k >= 0: entry i = 1 + ids scoring above ids[i+1]
};

// Teacher-forced log-probabilities of ids[1..] given the preceding ids (one prefill with all logits).
core::Expected<ScoreResult> score(backend::Backend& b, const std::vector<int32_t>& ids, int top_k = -1);

}  // namespace deltaflow::engine
