// Calibration for static activation scales (`deltaflow quantize --format nvfp4-mixed`): the largest |input|
// of every attention projection over some token windows, from the CPU reference forward pass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "model/quant/writer.hpp"

namespace deltaflow::backend::cpu {

core::Expected<model::quant::InputAmax> calibrate_input_amax(
    const std::string& model_dir, const std::vector<std::vector<int32_t>>& windows);

}  // namespace deltaflow::backend::cpu
