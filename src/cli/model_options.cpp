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

core::Expected<std::unique_ptr<backend::Backend>> open_backend(const Args& args) {
  DF_ASSIGN(engine::Device d, parse_device(args));
  DF_ASSIGN(int tp, parse_tensor_parallel(args, d));
  return engine::load_backend(model_dir(args), d, tp);
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
