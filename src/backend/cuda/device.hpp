// GPU discovery: what `--device auto` and `deltaflow inspect` need to know about the machine.
#pragma once

#include <string>
#include <vector>

#include "core/status.hpp"

namespace deltaflow::backend::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;
};

// The visible GPUs; an empty list (not an error) when there is no driver or no device.
std::vector<DeviceInfo> list_devices();

}  // namespace deltaflow::backend::cuda
