#include "cli/model_options.hpp"

#include "cli/commands.hpp"
#ifdef DELTAFLOW_HAVE_CUDA
#include "backend/cuda/device.hpp"
#endif

namespace deltaflow::cli {

std::string model_dir(const Args& args) {
  return args.get_or("--model", default_model_dir());
}

core::Expected<engine::Device> parse_device(const Args& args) {
  const std::string dev = args.get_or("--device", "auto");
  if (dev == "auto") return engine::Device::kAuto;
  if (dev == "cpu") return engine::Device::kCpu;
  if (dev == "cuda") return engine::Device::kCuda;
  return core::Error{"flag --device: '" + dev + "' is not one of cpu, cuda, auto"};
}

core::Expected<int> parse_tensor_parallel(const Args& args, engine::Device device) {
  DF_ASSIGN(long long n, args.get_int("--tensor-parallel-size", 1));
  if (n < 1 || n > 1024) return core::Error{"flag --tensor-parallel-size must be a positive integer"};
  if (n == 1) return 1;
  const std::string flag = "flag --tensor-parallel-size " + std::to_string(n);
  if (device == engine::Device::kCpu)
    return core::Error{flag + " needs --device cuda (the CPU backend runs on one device)"};
  long long visible = 0;
  std::string why;
#ifdef DELTAFLOW_HAVE_CUDA
  visible = static_cast<long long>(backend::cuda::list_devices().size());
#else
  why = " (this build has no CUDA backend)";
#endif
  if (n > visible)
    return core::Error{flag + ": " + std::to_string(visible) + (visible == 1 ? " GPU is" : " GPUs are") +
                       " visible" + why};
  return static_cast<int>(n);
}

core::Expected<std::unique_ptr<backend::Backend>> open_backend(const Args& args,
                                                               const engine::SchedulerOptions& engine) {
  return open_backend(args, model_dir(args), engine);
}

core::Expected<std::unique_ptr<backend::Backend>> open_backend(const Args& args, const std::string& dir,
                                                               const engine::SchedulerOptions& engine) {
  DF_ASSIGN(engine::Device d, parse_device(args));
  DF_ASSIGN(int tp, parse_tensor_parallel(args, d));
  engine::LoadLimits limits = engine::load_limits(engine);
  limits.emulate_activation_quant = args.has("--emulate-activation-quant");  // eval's flag
  return engine::load_backend(dir, d, tp, limits);
}

void add_engine_flags(ArgSpec& spec) {
  for (const char* f : {"--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-gb",
                        "--prefix-cache-gb", "--max-queue", "--speculative-tokens", "--kv-cache-dtype"})
    spec.with_value.insert(f);
  spec.boolean.insert("--no-prefix-cache");
}

core::Expected<engine::SchedulerOptions> parse_engine_options(const Args& args) {
  engine::SchedulerOptions o;
  DF_ASSIGN(long long len, args.get_int("--max-model-len", 0));
  if (len < 0) return core::Error{"flag --max-model-len must be positive"};
  o.max_model_len = len;
  DF_ASSIGN(long long seqs, args.get_int("--max-num-seqs", o.max_num_seqs));
  if (seqs < 1 || seqs > 65536) return core::Error{"flag --max-num-seqs must be in [1, 65536]"};
  o.max_num_seqs = static_cast<int32_t>(seqs);
  DF_ASSIGN(long long tokens, args.get_int("--max-num-batched-tokens", o.max_num_batched_tokens));
  if (tokens < 1 || tokens > (1 << 24))
    return core::Error{"flag --max-num-batched-tokens must be in [1, 16777216]"};
  o.max_num_batched_tokens = tokens;
  DF_ASSIGN(o.kv_cache_gb, args.get_double("--kv-cache-gb", 0.0));
  if (o.kv_cache_gb < 0 || o.kv_cache_gb > 1e5)
    return core::Error{"flag --kv-cache-gb must be in [0, 100000]"};
  DF_ASSIGN(o.prefix_cache_gb, args.get_double("--prefix-cache-gb", o.prefix_cache_gb));
  if (o.prefix_cache_gb < 0 || o.prefix_cache_gb > 1e5)
    return core::Error{"flag --prefix-cache-gb must be in [0, 100000]"};
  o.prefix_cache = !args.has("--no-prefix-cache") && o.prefix_cache_gb > 0;
  DF_ASSIGN(long long queue, args.get_int("--max-queue", 256));
  if (queue < 1 || queue > 100000) return core::Error{"flag --max-queue must be in [1, 100000]"};
  o.max_queue = static_cast<size_t>(queue);
  DF_ASSIGN(long long spec, args.get_int("--speculative-tokens", 0));
  if (spec < 0 || spec > engine::kMaxSpeculativeTokens)
    return core::Error{"flag --speculative-tokens must be in [0, " +
                       std::to_string(engine::kMaxSpeculativeTokens) + "]"};
  o.speculative_tokens = static_cast<int32_t>(spec);
  const std::string kv = args.get("--kv-cache-dtype").value_or("auto");
  if (kv == "bf16") {
    o.kv_cache_dtype = backend::KvCacheDtype::kBf16;
  } else if (kv == "fp8") {
    o.kv_cache_dtype = backend::KvCacheDtype::kFp8;
  } else if (kv != "auto") {
    return core::Error{"flag --kv-cache-dtype must be auto, bf16 or fp8, not '" + kv + "'"};
  }
  return o;
}

core::Expected<EngineHandle> open_engine(const Args& args) {
  return open_engine(args, model_dir(args));
}

core::Expected<EngineHandle> open_engine(const Args& args, const std::string& dir) {
  DF_ASSIGN(engine::SchedulerOptions o, parse_engine_options(args));
  EngineHandle h;
  DF_ASSIGN(h.backend, open_backend(args, dir, o));
  if (o.max_model_len > h.backend->config().max_position_embeddings)
    return core::Error{"flag --max-model-len " + std::to_string(o.max_model_len) + " exceeds the model's " +
                       std::to_string(h.backend->config().max_position_embeddings) +
                       " positions (max_position_embeddings)"};
  DF_ASSIGN(h.scheduler, engine::Scheduler::start(*h.backend, o));
  return h;
}

core::Expected<engine::SamplingParams> parse_sampling(const Args& args) {
  engine::SamplingParams p;
  DF_ASSIGN(double t, args.get_double("--temperature", 0.0));
  DF_ASSIGN(long long k, args.get_int("--top-k", 0));
  DF_ASSIGN(double tp, args.get_double("--top-p", 1.0));
  DF_ASSIGN(long long seed, args.get_int("--seed", 0));
  if (t < 0 || t > 100) return core::Error{"flag --temperature must be in [0, 100]"};
  if (k < 0) return core::Error{"flag --top-k must be non-negative"};
  if (tp <= 0 || tp > 1) return core::Error{"flag --top-p must be in (0, 1]"};
  p.temperature = static_cast<float>(t);
  p.top_k = static_cast<int>(k);
  p.top_p = static_cast<float>(tp);
  p.seed = static_cast<uint64_t>(seed);
  DF_ASSIGN(double min_p, args.get_double("--min-p", 0.0));
  DF_ASSIGN(double presence, args.get_double("--presence-penalty", 0.0));
  DF_ASSIGN(double frequency, args.get_double("--frequency-penalty", 0.0));
  DF_ASSIGN(double repetition, args.get_double("--repetition-penalty", 1.0));
  if (min_p < 0 || min_p > 1) return core::Error{"flag --min-p must be in [0, 1]"};
  if (presence < -2 || presence > 2) return core::Error{"flag --presence-penalty must be in [-2, 2]"};
  if (frequency < -2 || frequency > 2) return core::Error{"flag --frequency-penalty must be in [-2, 2]"};
  if (repetition <= 0 || repetition > 10) return core::Error{"flag --repetition-penalty must be in (0, 10]"};
  p.min_p = static_cast<float>(min_p);
  p.presence_penalty = static_cast<float>(presence);
  p.frequency_penalty = static_cast<float>(frequency);
  p.repetition_penalty = static_cast<float>(repetition);
  return p;
}

}  // namespace deltaflow::cli
