// Splits a reasoning model's output into the thought (`<think>...</think>`, the OpenAI `reasoning_content`)
// and the answer, incrementally: text arrives in detokenized pieces and leaves as reasoning / content deltas
// that never contain a tag or a piece of one.
//
// Qwen3.5's generation prompt already opens the thought (`<|im_start|>assistant\n<think>\n`), so the output
// usually starts inside it: construct with in_reasoning = true. A `<think>` the model writes itself at the
// very start opens one too (Qwen3 templates). `</think>` closes it. A `<tool_call>` inside a thought also
// ends it (the call and what follows are content), so a call is never lost in reasoning (vLLM #39056).
// Whitespace around the thought is trimmed the way the chat template trims it when re-rendering history:
// no leading/trailing whitespace in reasoning, no leading whitespace in the content right after `</think>`.
#pragma once

#include <string>
#include <string_view>

namespace deltaflow::text {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  explicit ReasoningParser(bool in_reasoning);

  ReasoningDelta push(std::string_view text);
  // End of output: releases whatever was held back.
  ReasoningDelta finish();

  bool in_reasoning() const { return mode_ == Mode::kReasoning; }

 private:
  enum class Mode { kReasoning, kContent };
  void run(ReasoningDelta& out, bool final);

  Mode mode_;
  std::string buf_;
  bool reasoning_start_;              // drop whitespace at the start of the thought
  bool content_after_think_ = false;  // drop whitespace right after </think>
  bool content_started_ = false;      // non-whitespace content seen: a later <think> is plain text
};

// Whole-text form of the parser (non-streaming replies).
ReasoningDelta split_reasoning(std::string_view text, bool in_reasoning);

}  // namespace deltaflow::text
