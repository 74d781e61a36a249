#include "model/quant/format.hpp"

namespace deltaflow::model::quant {

std::string_view format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kFloat:
      return "float";
    case WeightFormat::kNvfp4:
      return "NVFP4";
    case WeightFormat::kFp8:
      return "FP8";
  }
  return "?";
}

}  // namespace deltaflow::model::quant
