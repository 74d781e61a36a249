#include "cli/model_options.hpp"

#include "cli/commands.hpp"

namespace deltaflow::cli {

std::string model_dir(const Args& args) {
  return args.get_or("--model", default_model_dir());
}

core::Expected<std::unique_ptr<backend::Backend>> open_backend(const Args& args) {
  const std::string dev = args.get_or("--device", "auto");
  engine::Device d;
  if (dev == "auto") {
    d = engine::Device::kAuto;
  } else if (dev == "cpu") {
    d = engine::Device::kCpu;
  } else if (dev == "cuda") {
    d = engine::Device::kCuda;
  } else {
    return core::Error{"flag --device: '" + dev + "' is not one of cpu, cuda, auto"};
  }
  return engine::load_backend(model_dir(args), d);
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
