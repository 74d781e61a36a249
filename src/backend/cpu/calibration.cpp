#include "backend/cpu/calibration.hpp"

#include "backend/cpu/cpu_backend.hpp"

namespace deltaflow::backend::cpu {

core::Status calibrate(const std::string& model_dir, const std::vector<std::vector<int32_t>>& windows,
                       model::quant::InputAmax* amax, model::quant::InputStats* stats) {
  if (windows.empty()) return core::Error{"calibration: no windows"};
  DF_ASSIGN(auto b, CpuBackend::load(model_dir));
  b->record_input_amax(amax);
  b->record_input_stats(stats);
  for (const auto& w : windows) {
    auto s = b->new_sequence();
    std::vector<float> logits;
    DF_TRY(
        b->forward(static_cast<CpuSequenceState&>(*s), w, /*recurrent=*/false, /*all_logits=*/false, logits));
  }
  b->record_input_amax(nullptr);
  b->record_input_stats(nullptr);
  return core::Status();
}

core::Expected<model::quant::InputAmax> calibrate_input_amax(
    const std::string& model_dir, const std::vector<std::vector<int32_t>>& windows) {
  model::quant::InputAmax amax;
  DF_TRY(calibrate(model_dir, windows, &amax, nullptr));
  return amax;
}

}  // namespace deltaflow::backend::cpu
