// config.json of a checkpoint directory is untrusted input: any bytes must give a TextConfig or an error
// value naming the file, never a crash, a sanitizer report or an exception. What parses must hold together
// enough for the sizes derived from it not to overflow or divide by zero.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto c = deltaflow::model::parse_text_config(text, "fuzz/config.json");
  if (!c) {
    if (c.message().find("fuzz/config.json") == std::string::npos) __builtin_trap();  // errors name the file
    return 0;
  }
  if (c->num_hidden_layers <= 0 || c->hidden_size <= 0 || c->vocab_size <= 0) __builtin_trap();
  if (static_cast<int64_t>(c->layer_types.size()) != c->num_hidden_layers) __builtin_trap();
  (void)c->linear_conv_dim();
  (void)c->rotary_dim();
  for (int64_t i = 0; i < c->num_hidden_layers; ++i) (void)c->layer_is_moe(i);
  return 0;
}
