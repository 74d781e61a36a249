// Any text must parse without a crash, and streaming must not change the result: the input's first byte picks
// the chunk sizes, the rest is the model output. Checked: the streamed content and calls equal the
// whole-text parse (deltas only append, so no piece of a parsed call ever leaked into the streamed content),
// and every call's arguments are a JSON object.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "text/reasoning_parser.hpp"
#include "text/tool_call_parser.hpp"

using namespace deltaflow::text;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const unsigned step = 1 + data[0] % 13;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<ToolSpec> tools = {
      {"f", {{"a", {"integer"}}, {"b", {"object"}}, {"c", {"string", "null"}}, {"d", {"number"}}}},
      {"g", {{"x", {"array"}}, {"y", {"boolean"}}}}};
  const ParsedToolCalls whole = parse_tool_calls(text, tools);
  ToolCallParser p(tools);
  ParsedToolCalls streamed;
  auto take = [&](ToolParseDelta d) {
    streamed.content += d.content;
    for (auto& c : d.calls) {
      if (c.begin) streamed.calls.push_back({c.name, ""});
      if (static_cast<size_t>(c.index) >= streamed.calls.size()) __builtin_trap();
      streamed.calls[static_cast<size_t>(c.index)].arguments += c.arguments;
    }
  };
  for (size_t pos = 0; pos < text.size(); pos += step) take(p.push(std::string_view(text).substr(pos, step)));
  take(p.finish());
  if (streamed.content != whole.content || streamed.calls.size() != whole.calls.size()) __builtin_trap();
  for (size_t i = 0; i < whole.calls.size(); ++i) {
    if (streamed.calls[i].name != whole.calls[i].name ||
        streamed.calls[i].arguments != whole.calls[i].arguments)
      __builtin_trap();
    auto j = nlohmann::json::parse(whole.calls[i].arguments, nullptr, false);
    if (j.is_discarded() || !j.is_object()) __builtin_trap();
  }
  // The reasoning split must not crash on the same text either, streamed or whole.
  ReasoningParser r(data[0] & 1);
  ReasoningDelta all;
  for (size_t pos = 0; pos < text.size(); pos += step) {
    auto d = r.push(std::string_view(text).substr(pos, step));
    all.reasoning += d.reasoning;
    all.content += d.content;
  }
  auto d = r.finish();
  all.reasoning += d.reasoning;
  all.content += d.content;
  auto w = split_reasoning(text, data[0] & 1);
  if (all.reasoning != w.reasoning || all.content != w.content) __builtin_trap();
  return 0;
}
