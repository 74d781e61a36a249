// Element types as they appear in safetensors files, and scalar conversions to fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace deltaflow::core {

enum class DType : uint8_t { kBF16, kF16, kF32, kF8E4M3, kU8, kI8, kI32, kI64 };

// Bytes per element.
size_t dtype_size(DType t);
// The safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

// bf16 is the top half of an fp32.
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, as torch's .to(torch.bfloat16); NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
// Round an fp32 through bf16 and back: models torch's casts to the activation dtype.
inline float round_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// FP8 E4M3 (OCP "fn": no infinities, S.1111.111 is NaN, max 448).
float f8e4m3_to_f32(uint8_t v);

// Reads element i of a buffer of type t as fp32 (integer types convert by value).
float load_as_f32(const void* data, DType t, size_t i);

}  // namespace deltaflow::core
