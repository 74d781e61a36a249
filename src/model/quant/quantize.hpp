// Weight quantizers that write the published layouts bit for bit (quant-formats.md §1.1, §3):
//  - NVFP4 as ModelOpt 0.47's dynamic weight path (NVFP4QTensor.get_weights_scaling_factor{,_2} + quantize),
//    in its order of fp32 operations: s2 = amax / 2688; sb = blk_amax / (6 * s2), 0 -> 1, clamp [2^-9, 448],
//    E4M3 round-to-nearest-even; q = e2m1(w / (sb8 * s2)) with ModelOpt's tie rules.
//  - FP8 block 128 as Qwen's checkpoints: scale = blk_amax / 448 (stored BF16), w8 = e4m3(w / scale).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace deltaflow::model::quant {

// fp32 -> E4M3 (fn) code, round to nearest even; |x| above 448 saturates to 448 (callers clamp first, as
// ModelOpt does; torch's cast would give NaN).
uint8_t f32_to_e4m3(float x);
// ModelOpt's E2M1 rounding (_cast_fp4): searchsorted on [.25,.75,1.25,1.75,2.5,3.5,5] plus one at the odd
// bounds .75, 1.75, 3.5 (round half to even); the sign bit for every negative input, zero included.
uint8_t e2m1_code(float x);

// Static FP8 activation quantization (a W8A8 checkpoint's per-tensor `input_scale`, a multiplier), emulated
// in fp32 as ModelOpt's fake quant computes it (tensor_quant._fp8_eager with amax = input_scale * 448):
// out[i] = e4m3(clamp(x[i] * s, -448, 448)) * (1 / s), s = 448 / amax (about x / input_scale, in ModelOpt's
// order of operations, which decides the codes of inputs on a rounding boundary), E4M3 rounded to nearest
// even. `out` may be `x`. input_scale <= 0 (none stored) copies x unchanged.
void fake_quant_fp8_static(const float* x, size_t n, float input_scale, float* out);

struct Nvfp4Weight {
  std::vector<uint8_t> packed;  // [N, K/2]
  std::vector<uint8_t> scale;   // [N, K/16] E4M3
  float scale_2 = 0;            // weight_scale_2
};

// max |w| over n values (the amax ModelOpt calibrates; a fused group shares the max of its members').
float abs_max(const float* w, size_t n);
// ModelOpt's E4M3 block-scale code of one group of 16: blk_amax / (6 * s2), 0 -> 1, clamped to [2^-9, 448].
uint8_t nvfp4_block_code(const float* blk, float s2);
// W [N, K] (K a multiple of 16) with the group amax `amax`.
Nvfp4Weight quantize_nvfp4_modelopt(const float* w, int64_t N, int64_t K, float amax);

// FP8 per tensor as ModelOpt exports it (nvfp4-mixed's attention): scale = amax / 448 (fp32), codes
// e4m3(bf16(w / scale)) (the quotient rounded to the model's dtype first, as ModelOpt computes it).
struct Fp8TensorWeight {
  std::vector<uint8_t> w;  // E4M3
  float scale = 0;         // weight_scale
};
Fp8TensorWeight quantize_fp8_tensor_modelopt(const float* w, size_t n);

struct Fp8BlockWeight {
  std::vector<uint8_t> w;       // [N, K] E4M3
  std::vector<uint16_t> scale;  // [ceil(N/128), ceil(K/128)] BF16 weight_scale_inv
};
Fp8BlockWeight quantize_fp8_block(const float* w, int64_t N, int64_t K);

}  // namespace deltaflow::model::quant
