// Rooflines the GPU benchmarks measure in the same run (cmd_bench.cpp): the device-to-device copy bandwidth
// (bytes read + written per second) and the bf16 cuBLASLt GEMM rate (FLOP/s).
#pragma once

#ifdef DELTAFLOW_HAVE_CUDA
#include "core/status.hpp"

namespace deltaflow::cli {

core::Expected<double> measure_copy_bandwidth();
core::Expected<double> measure_gemm_rate();

}  // namespace deltaflow::cli
#endif
