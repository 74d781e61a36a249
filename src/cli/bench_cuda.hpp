// Rooflines the GPU benchmarks measure in the same run (cmd_bench.cpp): the device-to-device copy bandwidth
// (bytes read + written per second) and the bf16 cuBLASLt GEMM rate (FLOP/s).
#pragma once

#ifdef DELTAFLOW_HAVE_CUDA
#include <cstdint>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "core/status.hpp"

namespace deltaflow::cli {

core::Expected<double> measure_copy_bandwidth();
core::Expected<double> measure_gemm_rate();
// A flag's comma-separated positive integers, or `def` when the flag is absent.
core::Expected<std::vector<int64_t>> int_list(const Args& args, const std::string& flag,
                                              const std::string& def);

}  // namespace deltaflow::cli
#endif
