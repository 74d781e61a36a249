// The HTTP side of one choice (DESIGN.md §5): generated ids -> incremental detokenizer -> stop strings
// (matched across tokens, never emitted) -> reasoning split -> tool-call parser -> deltas for the response
// writers.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.hpp"
#include "text/detokenizer.hpp"
#include "text/reasoning_parser.hpp"
#include "text/tokenizer.hpp"
#include "text/tool_call_parser.hpp"

namespace deltaflow::server {

struct OutputOptions {
  bool reasoning = false;     // split <think>...</think> out of the text
  bool in_reasoning = false;  // the prompt ends inside a thought
  bool tools = false;         // parse tool calls
  std::vector<text::ToolSpec> tool_specs;
  std::string tool_prefix;  // text the prompt already holds inside a call (tool_choice required / named)
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
};

struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<text::ToolCallDelta> calls;
  std::vector<engine::SampledToken> tokens;  // the generated tokens this delta covers (logprobs)
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty() && tokens.empty(); }
  void append(OutputDelta&& o);
};

class ChoiceOutput {
 public:
  ChoiceOutput(const text::Tokenizer& tokenizer, OutputOptions options);

  // Deltas from text the prompt already holds (the tool prefix): a named call's name.
  OutputDelta start();
  // One generated token; `is_stop_token` marks the eos/stop id that ended the choice (not part of the text).
  OutputDelta feed(const engine::SampledToken& t, bool is_stop_token);
  // End of the choice: releases held-back text.
  OutputDelta finish();

  bool stopped_by_string() const { return stop_.stopped(); }
  int tool_calls() const { return tools_ ? tools_->calls() : 0; }
  int64_t tokens_used() const { return tokens_used_; }

 private:
  void route(std::string_view text, OutputDelta& out, bool final);

  OutputOptions opt_;
  text::IncrementalDetokenizer detok_;
  text::StopStringMatcher stop_;
  std::optional<text::ReasoningParser> reasoning_;
  std::optional<text::ToolCallParser> tools_;
  bool finished_ = false;
  int64_t tokens_used_ = 0;
};

}  // namespace deltaflow::server
