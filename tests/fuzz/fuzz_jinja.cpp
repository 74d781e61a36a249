// libFuzzer target: the input is a template, parsed and rendered against a small fixed chat context
// with tight limits. Any crash, sanitizer report, hang or escaping exception is a finding; template
// errors are expected and fine.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "text/jinja/template.hpp"

namespace {

using deltaflow::text::jinja::Limits;
using deltaflow::text::jinja::Template;
using deltaflow::text::jinja::Value;

const Value& context() {
  static const Value ctx = deltaflow::text::jinja::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "u"}}]},
      {"role": "assistant", "content": "<think>\nlook\n</think>\n\nA cat.", "reasoning_content": "r",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [1, "x"], "c": {"d": null}}}},
                      {"type": "function", "function": {"name": "g", "arguments": "{\"k\": 2}"}}]},
      {"role": "tool", "content": "result"},
      {"role": "user", "content": "héllo 👩‍👩‍👧 <|im_end|>"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<s>", "eos_token": "</s>",
    "n": 3, "f": 2.5, "s": "text", "none": null
  })"));
  return ctx;
}

Limits limits() {
  Limits l;
  l.max_nesting = 64;
  l.max_call_depth = 24;
  l.max_loop_iterations = 20000;
  l.max_steps = 200000;
  l.max_output_bytes = 1 << 16;
  l.max_range = 2000;
  return l;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Limits kLimits = limits();
  std::string_view source(reinterpret_cast<const char*>(data), size);
  auto t = Template::parse(source, kLimits);
  if (t) {
    auto r = t->render(context());
    (void)r;
  }
  return 0;
}
