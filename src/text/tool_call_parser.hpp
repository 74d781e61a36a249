// Tool calls out of the answer text of Qwen models, incrementally (vLLM's qwen3_coder / hermes parsers are
// the references). Two formats, told apart by what follows `<tool_call>`:
//
//   Qwen3.5 / Qwen3-Coder XML            Qwen3 JSON (hermes)
//   <tool_call>                           <tool_call>
//   <function=get_weather>                {"name": "get_weather", "arguments": {"city": "Paris"}}
//   <parameter=city>                      </tool_call>
//   Paris
//   </parameter>
//   </function>
//   </tool_call>
//
// XML parameter values are text; they are typed by the tool's JSON schema (integer, number, boolean, object,
// array, null parsed; strings and anything that does not parse kept as strings) so that `arguments` is always
// a valid JSON object text. A bare `<function=...>` without `<tool_call>` is accepted too, and a missing
// `</parameter>` ends at the next `<parameter=` or `</function>`.
//
// Streaming contract: content deltas never hold `<tool_call>` or a prefix of it; each call yields a first
// delta with its name, then argument pieces that concatenate to its arguments JSON (XML: one piece per
// finished parameter, then the closing brace; JSON: the whole object at `</tool_call>`). Whitespace around
// calls is dropped. A call that cannot be parsed (invalid JSON, no function name) comes back as content, raw.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace deltaflow::text {

// What the parser needs of one tool: its name and each parameter's JSON-schema types ("integer", "string",
// ...; several for a union). A parameter that is missing, or has no types, is kept as a string.
struct ToolSpec {
  std::string name;
  std::map<std::string, std::vector<std::string>> param_types;
};

struct ToolCallDelta {
  int index = 0;       // the call's position among the calls of this output
  bool begin = false;  // first delta of the call: `name` is set
  std::string name;
  std::string arguments;  // the next piece of the arguments JSON text
};

struct ToolParseDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
};

class ToolCallParser {
 public:
  explicit ToolCallParser(std::vector<ToolSpec> tools);

  ToolParseDelta push(std::string_view text);
  // End of output: finishes an open call if it can be finished (XML with a name), else returns it as content.
  ToolParseDelta finish();

  int calls() const { return next_index_; }

 private:
  enum class Mode { kText, kCall };
  void run(ToolParseDelta& out, bool final);
  void emit_text(ToolParseDelta& out, std::string_view s, bool final);
  // XML body parsing from body_pos_; returns false when it needs more text.
  bool step_xml(ToolParseDelta& out, bool final);
  void open_call(ToolParseDelta& out, const std::string& name);
  void close_call(ToolParseDelta& out);
  void emit_param(ToolParseDelta& out, const std::string& key, std::string_view raw_value);
  const ToolSpec* find_tool(const std::string& name) const;

  std::vector<ToolSpec> tools_;
  Mode mode_ = Mode::kText;
  std::string buf_;          // text mode: unconsumed text; call mode: the call body after <tool_call>
  std::string held_space_;   // text mode: trailing whitespace not yet released
  bool after_call_ = false;  // a call has ended: whitespace-only text is dropped
  bool implicit_ = false;    // the call began at a bare <function= (ends at </function>)
  int next_index_ = 0;
  // XML state within the current body.
  size_t body_pos_ = 0;
  bool in_function_ = false;
  bool call_open_ = false;  // a call delta with its name has been emitted, arguments not closed
  int params_ = 0;
  int block_calls_ = 0;  // calls opened in the current block
  std::string function_name_;
};

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON object text
};

struct ParsedToolCalls {
  std::string content;
  std::vector<ToolCall> calls;
};

// Whole-text form (non-streaming replies).
ParsedToolCalls parse_tool_calls(std::string_view text, const std::vector<ToolSpec>& tools);

// The typing rule for one XML parameter value (exposed for tests): returns JSON text.
std::string convert_param_value(std::string_view value, const std::vector<std::string>& types);

}  // namespace deltaflow::text
