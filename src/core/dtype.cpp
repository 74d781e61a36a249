#include "core/dtype.hpp"

#include <cmath>

namespace deltaflow::core {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kF8E4M3:
    case DType::kU8:
    case DType::kI8:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF32:
      return "F32";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view n) {
  if (n == "BF16") return DType::kBF16;
  if (n == "F16") return DType::kF16;
  if (n == "F32") return DType::kF32;
  if (n == "F8_E4M3") return DType::kF8E4M3;
  if (n == "U8") return DType::kU8;
  if (n == "I8") return DType::kI8;
  if (n == "I32") return DType::kI32;
  if (n == "I64") return DType::kI64;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);  // subnormal
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {                                               // subnormal or zero
    const float a = std::fabs(f);
    const uint32_t m = static_cast<uint32_t>(std::nearbyint(a * 16777216.0f));  // 2^24
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u) - (112u << 23);
  return static_cast<uint16_t>(sign | (r >> 13));
}

float f8e4m3_to_f32(uint8_t v) {
  const uint32_t sign = v >> 7, exp = (v >> 3) & 0xfu, man = v & 0x7u;
  float r;
  if (exp == 0xf && man == 0x7) {
    r = NAN;
  } else if (exp == 0) {
    r = std::ldexp(static_cast<float>(man), -9);
  } else {
    r = std::ldexp(static_cast<float>(man | 0x8u), static_cast<int>(exp) - 10);
  }
  return sign ? -r : r;
}

float load_as_f32(const void* data, DType t, size_t i) {
  const auto* b = static_cast<const uint8_t*>(data);
  switch (t) {
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      return f16_to_f32(h);
    }
    case DType::kF32: {
      float f;
      std::memcpy(&f, b + 4 * i, 4);
      return f;
    }
    case DType::kF8E4M3:
      return f8e4m3_to_f32(b[i]);
    case DType::kU8:
      return static_cast<float>(b[i]);
    case DType::kI8:
      return static_cast<float>(static_cast<int8_t>(b[i]));
    case DType::kI32: {
      int32_t x;
      std::memcpy(&x, b + 4 * i, 4);
      return static_cast<float>(x);
    }
    case DType::kI64: {
      int64_t x;
      std::memcpy(&x, b + 8 * i, 8);
      return static_cast<float>(x);
    }
  }
  return 0.0f;
}

}  // namespace deltaflow::core
