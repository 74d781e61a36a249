#include "server/choice_output.hpp"

namespace deltaflow::server {

void OutputDelta::append(OutputDelta&& o) {
  reasoning += o.reasoning;
  content += o.content;
  for (auto& c : o.calls) calls.push_back(std::move(c));
  for (auto& t : o.tokens) tokens.push_back(std::move(t));
}

ChoiceOutput::ChoiceOutput(const text::Tokenizer& tokenizer, OutputOptions options)
    : opt_(std::move(options)), detok_(tokenizer, opt_.skip_special_tokens), stop_(opt_.stop) {
  if (opt_.reasoning) reasoning_.emplace(opt_.in_reasoning);
  if (opt_.tools) tools_.emplace(opt_.tool_specs);
}

OutputDelta ChoiceOutput::start() {
  OutputDelta out;
  if (tools_ && !opt_.tool_prefix.empty()) {
    auto d = tools_->push(opt_.tool_prefix);
    out.content += d.content;
    for (auto& c : d.calls) out.calls.push_back(std::move(c));
  }
  return out;
}

void ChoiceOutput::route(std::string_view text, OutputDelta& out, bool final) {
  std::string content;
  if (reasoning_) {
    auto r = text.empty() ? text::ReasoningDelta{} : reasoning_->push(text);
    if (final) {
      auto f = reasoning_->finish();
      r.reasoning += f.reasoning;
      r.content += f.content;
    }
    out.reasoning += r.reasoning;
    content = std::move(r.content);
  } else {
    content = std::string(text);
  }
  if (tools_) {
    auto t = content.empty() ? text::ToolParseDelta{} : tools_->push(content);
    if (final) {
      auto f = tools_->finish();
      t.content += f.content;
      for (auto& c : f.calls) t.calls.push_back(std::move(c));
    }
    out.content += t.content;
    for (auto& c : t.calls) out.calls.push_back(std::move(c));
  } else {
    out.content += content;
  }
}

OutputDelta ChoiceOutput::feed(const engine::SampledToken& t, bool is_stop_token) {
  OutputDelta out;
  if (finished_ || stop_.stopped()) return out;
  ++tokens_used_;  // the stop token counts in usage, as vLLM counts it, but has no text and no logprob entry
  if (is_stop_token) return out;
  out.tokens.push_back(t);
  std::string piece;
  detok_.feed(t.id, piece);
  if (piece.empty()) return out;
  const std::string safe = stop_.feed(piece);
  route(safe, out, false);
  return out;
}

OutputDelta ChoiceOutput::finish() {
  OutputDelta out;
  if (finished_) return out;
  finished_ = true;
  std::string tail;
  if (!stop_.stopped()) {
    tail = stop_.feed(detok_.finish());
    if (!stop_.stopped()) tail += stop_.flush();
  }
  route(tail, out, true);
  return out;
}

}  // namespace deltaflow::server
