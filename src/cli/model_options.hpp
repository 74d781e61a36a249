// Flags shared by the subcommands that run a model: --model, --device, and the sampling flags.
#pragma once

#include <memory>

#include "backend/backend.hpp"
#include "cli/args.hpp"
#include "engine/generate.hpp"
#include "engine/scheduler.hpp"

namespace deltaflow::cli {

// --model DIR (default: the house model), --device cpu|cuda|auto, --tensor-parallel-size N.
std::string model_dir(const Args& args);
core::Expected<engine::Device> parse_device(const Args& args);
// --tensor-parallel-size N (default 1): the model split over N GPUs of this host. N > 1 with --device cpu,
// or more than the visible GPUs, is an error.
core::Expected<int> parse_tensor_parallel(const Args& args, engine::Device device);
core::Expected<std::unique_ptr<backend::Backend>> open_backend(const Args& args,
                                                               const engine::SchedulerOptions& engine = {});
// The same with the model directory given (eval --reference loads a second model with the same flags).
core::Expected<std::unique_ptr<backend::Backend>> open_backend(const Args& args, const std::string& dir,
                                                               const engine::SchedulerOptions& engine);

// The engine's flags: --max-model-len, --max-num-seqs, --max-num-batched-tokens, --kv-cache-gb,
// --prefix-cache-gb, --max-queue (values) and --no-prefix-cache (boolean). add_engine_flags puts them in a
// subcommand's ArgSpec.
void add_engine_flags(ArgSpec& spec);
core::Expected<engine::SchedulerOptions> parse_engine_options(const Args& args);

// A loaded backend with the engine running on it.
struct EngineHandle {
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<engine::Scheduler> scheduler;  // declared last: stopped before the backend goes
};
core::Expected<EngineHandle> open_engine(const Args& args);
core::Expected<EngineHandle> open_engine(const Args& args, const std::string& dir);
// --temperature, --top-k, --top-p, --min-p, --seed and the presence / frequency / repetition penalties.
core::Expected<engine::SamplingParams> parse_sampling(const Args& args);

}  // namespace deltaflow::cli
