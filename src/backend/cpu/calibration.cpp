#include "backend/cpu/calibration.hpp"

#include "backend/cpu/cpu_backend.hpp"

namespace deltaflow::backend::cpu {

core::Expected<model::quant::InputAmax> calibrate_input_amax(
    const std::string& model_dir, const std::vector<std::vector<int32_t>>& windows) {
  if (windows.empty()) return core::Error{"calibration: no windows"};
  DF_ASSIGN(auto b, CpuBackend::load(model_dir));
  model::quant::InputAmax amax;
  b->record_input_amax(&amax);
  for (const auto& w : windows) {
    auto s = b->new_sequence();
    std::vector<float> logits;
    DF_TRY(
        b->forward(static_cast<CpuSequenceState&>(*s), w, /*recurrent=*/false, /*all_logits=*/false, logits));
  }
  b->record_input_amax(nullptr);
  return amax;
}

}  // namespace deltaflow::backend::cpu
