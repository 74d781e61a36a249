#include "engine/generate.hpp"

#include <algorithm>

#include "backend/cpu/cpu_backend.hpp"
#include "engine/token_picker.hpp"
#ifdef DELTAFLOW_HAVE_CUDA
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/device.hpp"
#include "backend/cuda/tp_backend.hpp"
#endif

namespace deltaflow::engine {

core::Expected<std::unique_ptr<backend::Backend>> load_backend(const std::string& dir, Device device,
                                                               int tensor_parallel) {
  if (tensor_parallel > 1 && device == Device::kCpu)
    return core::Error{"tensor parallelism needs --device cuda: the CPU backend runs on one device"};
#ifdef DELTAFLOW_HAVE_CUDA
  if (tensor_parallel > 1) {
    backend::cuda::CudaOptions opt;
    opt.progress = true;
    backend::cuda::TpOptions tp;
    tp.world = tensor_parallel;
    DF_ASSIGN(auto b, backend::cuda::TpBackend::load(dir, opt, tp));
    return std::unique_ptr<backend::Backend>(std::move(b));
  }
  if (device == Device::kCuda || (device == Device::kAuto && !backend::cuda::list_devices().empty())) {
    backend::cuda::CudaOptions opt;
    opt.progress = true;
    DF_ASSIGN(auto cuda, backend::cuda::CudaBackend::load(dir, opt));
    return std::unique_ptr<backend::Backend>(std::move(cuda));
  }
#else
  if (tensor_parallel > 1)
    return core::Error{
        "tensor parallelism: this build has no CUDA backend (configure with -DDELTAFLOW_CUDA=ON)"};
  if (device == Device::kCuda)
    return core::Error{"--device cuda: this build has no CUDA backend (configure with -DDELTAFLOW_CUDA=ON)"};
#endif
  DF_ASSIGN(auto cpu, backend::cpu::CpuBackend::load(dir));
  return std::unique_ptr<backend::Backend>(std::move(cpu));
}

core::Expected<GenerateResult> generate(backend::Backend& b, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& opt,
                                        const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) return core::Error{"the prompt is empty"};
  const int64_t max_len = b.config().max_position_embeddings;
  if (static_cast<int64_t>(prompt.size()) + opt.max_tokens > max_len)
    return core::Error{"prompt (" + std::to_string(prompt.size()) + " tokens) + max tokens (" +
                       std::to_string(opt.max_tokens) + ") exceeds the model length " +
                       std::to_string(max_len)};
  GenerateResult r;
  r.finish_reason = "length";
  if (opt.max_tokens <= 0) return r;
  auto seq = b.new_sequence();
  std::vector<float> logits;
  backend::PrefillItem item{seq.get(), prompt, false};
  DF_TRY(b.prefill(std::span<const backend::PrefillItem>(&item, 1), logits));
  TokenPicker picker(b, opt.sampling, /*need_logits=*/false);
  picker.add_prompt(prompt);
  DF_TRY(picker.start(logits));
  for (int i = 0; i < opt.max_tokens; ++i) {
    const int32_t id = picker.pick(logits);
    picker.accept(id);
    r.ids.push_back(id);
    if (on_token && !on_token(id)) {
      r.finish_reason = "stop";
      break;
    }
    if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), id) != opt.stop_ids.end()) {
      r.finish_reason = "stop";
      break;
    }
    if (i + 1 == opt.max_tokens) break;
    DF_TRY(picker.advance(seq.get(), id, logits));
  }
  return r;
}

core::Expected<ScoreResult> score(backend::Backend& b, const std::vector<int32_t>& ids, int top_k) {
  if (ids.size() < 2) return core::Error{"scoring needs at least 2 ids"};
  if (static_cast<int64_t>(ids.size()) > b.config().max_position_embeddings)
    return core::Error{"sequence of " + std::to_string(ids.size()) + " ids exceeds the model length " +
                       std::to_string(b.config().max_position_embeddings)};
  auto seq = b.new_sequence();
  std::vector<float> logits;
  backend::PrefillItem item{seq.get(), ids, true};
  DF_TRY(b.prefill(std::span<const backend::PrefillItem>(&item, 1), logits));
  const size_t V = static_cast<size_t>(b.config().vocab_size);
  ScoreResult r;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    const std::span<const float> row(logits.data() + i * V, V);
    const double lp = log_prob(row, ids[i + 1]);
    r.logprobs.push_back(lp);
    if (top_k >= 0) {
      r.top.push_back(top_logprobs(row, top_k));
      r.ranks.push_back(1 +
                        std::count_if(row.begin(), row.end(), [&](float x) { return x > row[ids[i + 1]]; }));
    }
    r.nll -= lp;
  }
  return r;
}

}  // namespace deltaflow::engine
