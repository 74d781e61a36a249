// Calibration for `deltaflow quantize`, from the CPU reference forward pass over some token windows: the
// largest |input| of every linear module (nvfp4-mixed's static activation scales) and, when asked, the Gram
// matrix X^T X of each one's input (--method mse weights, gptq).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "model/quant/writer.hpp"

namespace deltaflow::backend::cpu {

core::Expected<model::quant::InputAmax> calibrate_input_amax(
    const std::string& model_dir, const std::vector<std::vector<int32_t>>& windows);

// Either output may be null.
core::Status calibrate(const std::string& model_dir, const std::vector<std::vector<int32_t>>& windows,
                       model::quant::InputAmax* amax, model::quant::InputStats* stats);

}  // namespace deltaflow::backend::cpu
