#include "text/reasoning_parser.hpp"

#include <algorithm>
#include "text/tag_scan.hpp"

namespace deltaflow::text {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolCall = "<tool_call>";

size_t trailing_space(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && is_ascii_space(s[s.size() - 1 - n])) ++n;
  return n;
}

void drop_leading_space(std::string& s) {
  size_t i = 0;
  while (i < s.size() && is_ascii_space(s[i])) ++i;
  s.erase(0, i);
}

}  // namespace

ReasoningParser::ReasoningParser(bool in_reasoning)
    : mode_(in_reasoning ? Mode::kReasoning : Mode::kContent), reasoning_start_(in_reasoning) {}

ReasoningDelta ReasoningParser::push(std::string_view text) {
  buf_.append(text);
  ReasoningDelta out;
  run(out, false);
  return out;
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta out;
  run(out, true);
  return out;
}

void ReasoningParser::run(ReasoningDelta& out, bool final) {
  for (;;) {
    if (mode_ == Mode::kReasoning) {
      if (reasoning_start_) {
        drop_leading_space(buf_);
        if (buf_.empty()) return;
        reasoning_start_ = false;
      }
      const size_t close = buf_.find(kThinkClose);
      const size_t call = buf_.find(kToolCall);
      const size_t end = std::min(close, call);
      if (end != std::string::npos) {
        std::string_view thought(buf_.data(), end);
        thought.remove_suffix(trailing_space(thought));
        out.reasoning.append(thought);
        if (end == close) {
          buf_.erase(0, close + kThinkClose.size());
          content_after_think_ = true;
        } else {
          buf_.erase(0, call);  // the call starts the content
        }
        mode_ = Mode::kContent;
        continue;
      }
      if (final) {
        std::string_view thought(buf_);
        thought.remove_suffix(trailing_space(thought));
        out.reasoning.append(thought);
        buf_.clear();
        return;
      }
      // Hold a possible partial tag, and the whitespace before it (it may precede </think>).
      size_t hold = std::max(partial_tag_suffix(buf_, kThinkClose), partial_tag_suffix(buf_, kToolCall));
      hold += trailing_space(std::string_view(buf_).substr(0, buf_.size() - hold));
      out.reasoning.append(buf_, 0, buf_.size() - hold);
      buf_.erase(0, buf_.size() - hold);
      return;
    }
    // Content.
    if (content_after_think_) {
      drop_leading_space(buf_);
      if (buf_.empty()) return;
      content_after_think_ = false;
      content_started_ = true;
    }
    if (!content_started_) {
      size_t i = 0;
      while (i < buf_.size() && is_ascii_space(buf_[i])) ++i;
      std::string_view rest = std::string_view(buf_).substr(i);
      if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
        buf_.erase(0, i + kThinkOpen.size());
        mode_ = Mode::kReasoning;
        reasoning_start_ = true;
        continue;
      }
      const bool maybe_open = rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest;
      if (maybe_open && !final) return;  // wait: it may still become <think>
      content_started_ = true;
    }
    out.content.append(buf_);
    buf_.clear();
    return;
  }
}

ReasoningDelta split_reasoning(std::string_view text, bool in_reasoning) {
  ReasoningParser p(in_reasoning);
  ReasoningDelta a = p.push(text);
  ReasoningDelta b = p.finish();
  a.reasoning += b.reasoning;
  a.content += b.content;
  return a;
}

}  // namespace deltaflow::text
