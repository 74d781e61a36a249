// Quantized checkpoints exported by the real producers (ModelOpt 0.47 export_hf_checkpoint, llm-compressor
// 0.14 oneshot, Qwen's FP8 layout read back by transformers; tools/reference/make_quant_goldens.py) loaded by
// the CPU backend and held to transformers 5.17 run in fp32 on the same weights dequantized.
//
// Tolerance: our dequantized weights equal the producers' own fp32 dequantization bit for bit (checked by the
// generator), and both sides run fp32 activations, so only the order of operations differs, as for the float
// goldens: max |ours - ref| <= 5e-5 * max(1, max |ref|).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../golden_file.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "io/safetensors.hpp"
#include "model/quant/quantize.hpp"
#include "model/weight_summary.hpp"

namespace deltaflow {
namespace {

using backend::cpu::CpuBackend;
using backend::cpu::CpuSequenceState;

constexpr double kTol = 5e-5;

struct Case {
  std::string name;
  int nvfp4 = 0, fp8 = 0;  // quantized matrices the binder must find
};

std::string fixture(const std::string& rel) {
  return std::string(DF_FIXTURES) + "/quant/" + rel;
}

std::vector<float> f32(const io::SafetensorsFile& f, const std::string& name) {
  for (const auto& e : f.header().tensors)
    if (e.name == name && e.dtype == core::DType::kF32) {
      std::vector<float> v(static_cast<size_t>(e.numel()));
      std::memcpy(v.data(), f.tensor_data(e), v.size() * 4);
      return v;
    }
  ADD_FAILURE() << "golden tensor " << name;
  return {};
}

std::vector<int32_t> i32(const io::SafetensorsFile& f, const std::string& name) {
  for (const auto& e : f.header().tensors)
    if (e.name == name && e.dtype == core::DType::kI32) {
      std::vector<int32_t> v(static_cast<size_t>(e.numel()));
      std::memcpy(v.data(), f.tensor_data(e), v.size() * 4);
      return v;
    }
  ADD_FAILURE() << "golden tensor " << name;
  return {};
}

using testing_golden::rel_err;

class QuantGoldens : public ::testing::TestWithParam<Case> {};

TEST_P(QuantGoldens, LogitsMatchTransformersOnTheDequantizedWeights) {
  const Case& c = GetParam();
  auto b = CpuBackend::load(fixture(c.name));
  ASSERT_TRUE(b.is_ok()) << b.message();
  auto& be = **b;
  // The binder found the formats the producer wrote (not a float fallback).
  int nvfp4 = 0, fp8 = 0;
  model::for_each_weight(be.config(), be.weights(), [&](const std::string&, const model::Mat& m) {
    nvfp4 += m.format == model::quant::WeightFormat::kNvfp4;
    fp8 += m.format == model::quant::WeightFormat::kFp8;
  });
  EXPECT_EQ(nvfp4, c.nvfp4);
  EXPECT_EQ(fp8, c.fp8);

  auto g = io::SafetensorsFile::open(fixture(c.name + ".safetensors"));
  ASSERT_TRUE(g.is_ok()) << g.message();
  for (int n : {1, 9, 40}) {
    const auto ids = i32(**g, "ids_" + std::to_string(n));
    ASSERT_EQ(ids.size(), static_cast<size_t>(n));
    auto s = be.new_sequence();
    std::vector<float> logits;
    ASSERT_TRUE(be.forward(static_cast<CpuSequenceState&>(*s), ids, false, true, logits).is_ok());
    EXPECT_LE(rel_err(logits, f32(**g, "logits_" + std::to_string(n))), kTol) << c.name << " length " << n;
  }
}

// Counts from the generator's report (make_quant_goldens.py prints them per case).
INSTANTIATE_TEST_SUITE_P(Producers, QuantGoldens,
                         ::testing::Values(Case{"modelopt_nvfp4_dense", 26, 0},
                                           Case{"modelopt_w4a16_moe", 152, 0},
                                           Case{"modelopt_mixed_dense", 13, 14},
                                           Case{"ct_nvfp4a16_dense", 26, 0}, Case{"ct_fp8block_moe", 0, 152},
                                           Case{"ct_fp8dynamic_dense", 0, 26}, Case{"qwen_fp8_dense", 0, 26}),
                         [](const auto& info) { return info.param.name; });

// --emulate-activation-quant (CpuOptions::emulate_activation_quant): the FP8 attention projections of
// ModelOpt's MIXED_PRECISION export see their inputs fake-quantized at the stored input_scale; held to
// transformers with ModelOpt's own fp8_eager on those inputs (make_quant_goldens.py --a8). Without the option
// the same checkpoint gives the weight-only goldens above, which differ from these by far more than the
// tolerance.
TEST(QuantGoldens, EmulatedFp8ActivationsMatchModelOptsFakeQuant) {
  backend::cpu::CpuOptions opt;
  opt.emulate_activation_quant = true;
  auto b = CpuBackend::load(fixture("modelopt_mixed_dense"), opt);
  ASSERT_TRUE(b.is_ok()) << b.message();
  auto& be = **b;
  int static_fp8 = 0;
  model::for_each_weight(be.config(), be.weights(), [&](const std::string&, const model::Mat& m) {
    static_fp8 += m.format == model::quant::WeightFormat::kFp8 && m.input_scale > 0;
  });
  EXPECT_EQ(static_fp8, 14);
  auto g = io::SafetensorsFile::open(fixture("modelopt_mixed_dense_a8.safetensors"));
  ASSERT_TRUE(g.is_ok()) << g.message();
  auto w = io::SafetensorsFile::open(fixture("modelopt_mixed_dense.safetensors"));
  ASSERT_TRUE(w.is_ok()) << w.message();
  for (int n : {1, 9, 40}) {
    const auto ids = i32(**g, "ids_" + std::to_string(n));
    auto s = be.new_sequence();
    std::vector<float> logits;
    ASSERT_TRUE(be.forward(static_cast<CpuSequenceState&>(*s), ids, false, true, logits).is_ok());
    const auto want = f32(**g, "logits_" + std::to_string(n));
    EXPECT_LE(rel_err(logits, want), kTol) << "length " << n;
    EXPECT_GT(rel_err(f32(**w, "logits_" + std::to_string(n)), want), 100 * kTol) << "length " << n;
  }
}

TEST(QuantFakeQuant, Fp8StaticActivationsRoundClampAndKeepSubnormals) {
  const float s = 0.5f;
  // x / s: 2 (exact), 1.06 -> 1 (E4M3 steps 1/8 at 1), 1.07 -> 1.125, 600 -> 448 (clamp), -2000 -> -448,
  // 0.6 * 2^-9 -> 2^-9 (the smallest subnormal), 0.4 * 2^-9 -> 0, 17 -> 16 (ties to even: 16, 18).
  const std::vector<float> x = {1.0f, 0.53f, 0.535f, 300.0f, -1000.0f, 0.3f * 0x1p-9f, 0.2f * 0x1p-9f, 8.5f};
  const std::vector<float> want = {1.0f, 0.5f, 0.5625f, 224.0f, -224.0f, 0x1p-10f, 0.0f, 8.0f};
  std::vector<float> out(x.size());
  model::quant::fake_quant_fp8_static(x.data(), x.size(), s, out.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(out[i], want[i]) << i;
  // No input scale: unchanged (in place too).
  std::vector<float> y = x;
  model::quant::fake_quant_fp8_static(y.data(), y.size(), 0.0f, y.data());
  EXPECT_EQ(y, x);
}

}  // namespace
}  // namespace deltaflow
