// Any bytes as tokenizer.json text must give a tokenizer or an error value: no crash, no sanitizer report, no
// exception. What loads must encode hard text and decode it back to that text's repaired form.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "text/detokenizer.hpp"
#include "text/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto tok = deltaflow::text::Tokenizer::load_from_json_text(text);
  if (!tok) return 0;
  static const std::string kProbe =
      "Hello, world! it's 12345 <|im_start|>user\n你好 e\xcc\x81 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd  \t\r\n"
      "\xff\xc3 <think>x</think> aaaaaaaaaaaaaaaaaaaaaaaa";
  const auto ids = tok->encode(kProbe);
  for (int32_t id : ids)
    if (id < 0 || static_cast<size_t>(id) >= tok->vocab_size()) __builtin_trap();
  const std::string all = tok->decode(ids, false);
  deltaflow::text::IncrementalDetokenizer d(*tok, false);
  std::string streamed;
  for (int32_t id : ids) d.feed(id, streamed);
  streamed += d.finish();
  if (streamed != all) __builtin_trap();
  (void)tok->decode(ids, true);
  return 0;
}
