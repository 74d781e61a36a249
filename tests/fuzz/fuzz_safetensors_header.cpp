// Any bytes must give either a header or an error value: no crash, no sanitizer report, no exception.
// The input is the whole "file", so the length prefix and data section are fuzzed too.
#include <cstddef>
#include <cstdint>

#include "io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = deltaflow::io::parse_safetensors_header(data, size, "fuzz.safetensors");
  if (r.is_ok()) {
    // What the parser accepted must be safe to use: every range lies inside the input.
    for (const auto& t : r->tensors) {
      if (r->data_offset + t.end > size || t.begin > t.end) __builtin_trap();
    }
  }
  return 0;
}
