// The reasoning split, whole and streamed in every split: the same result, and no delta holding a tag.
#include <gtest/gtest.h>

#include "text/reasoning_parser.hpp"

namespace deltaflow::text {
namespace {

ReasoningDelta stream(const std::string& text, const std::vector<size_t>& cuts, bool in_reasoning,
                      std::vector<ReasoningDelta>* deltas = nullptr) {
  ReasoningParser p(in_reasoning);
  ReasoningDelta all;
  size_t pos = 0;
  auto take = [&](ReasoningDelta d) {
    if (deltas) deltas->push_back(d);
    all.reasoning += d.reasoning;
    all.content += d.content;
  };
  for (size_t c : cuts) {
    take(p.push(std::string_view(text).substr(pos, c - pos)));
    pos = c;
  }
  take(p.push(std::string_view(text).substr(pos)));
  take(p.finish());
  return all;
}

void expect_split(const std::string& text, bool in_reasoning, const std::string& reasoning,
                  const std::string& content) {
  auto whole = split_reasoning(text, in_reasoning);
  EXPECT_EQ(whole.reasoning, reasoning);
  EXPECT_EQ(whole.content, content);
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  std::vector<ReasoningDelta> deltas;
  auto by_char = stream(text, every, in_reasoning, &deltas);
  EXPECT_EQ(by_char.reasoning, reasoning);
  EXPECT_EQ(by_char.content, content);
  // Before the end, no delta holds a tag or a piece of one (finish() may release an unfinished one).
  for (size_t i = 0; i + 1 < deltas.size(); ++i)
    EXPECT_EQ(deltas[i].reasoning.find("<"), std::string::npos) << deltas[i].reasoning;
  for (size_t a = 0; a <= text.size(); ++a) {
    auto two = stream(text, {a}, in_reasoning);
    EXPECT_EQ(two.reasoning, reasoning) << "cut " << a;
    EXPECT_EQ(two.content, content) << "cut " << a;
  }
}

TEST(ReasoningParser, Qwen35OutputAfterOpenThought) {
  // The generation prompt ends "<think>\n"; the model writes the thought, "\n</think>\n\n", then the answer.
  expect_split("The user greets me.\nI should answer briefly.\n</think>\n\nHello! How can I help?", true,
               "The user greets me.\nI should answer briefly.", "Hello! How can I help?");
}

TEST(ReasoningParser, ModelOpensItsOwnThought) {
  expect_split("<think>\nLet me think.\n</think>\n\nAnswer.", false, "Let me think.", "Answer.");
  expect_split("\n<think>x</think>y", false, "x", "y");
}

TEST(ReasoningParser, NoThinkingKeepsContentAsIs) {
  expect_split("  Plain answer with </think> inside.", false, "", "  Plain answer with </think> inside.");
  expect_split("Answer then <think>late</think>", false, "", "Answer then <think>late</think>");
}

TEST(ReasoningParser, UnclosedThoughtIsAllReasoning) {
  expect_split("Thinking forever about </thi", true, "Thinking forever about </thi", "");
}

TEST(ReasoningParser, EmptyThought) {
  expect_split("\n\n</think>\n\nJust the answer.", true, "", "Just the answer.");
}

TEST(ReasoningParser, ToolCallEndsThought) {
  expect_split("I need the weather.\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>", true,
               "I need the weather.", "<tool_call>\n<function=f>\n</function>\n</tool_call>");
}

TEST(ReasoningParser, StreamsReasoningBeforeTheClose) {
  ReasoningParser p(true);
  auto d = p.push("\nStep one. ");
  EXPECT_EQ(d.reasoning, "Step one.");
  d = p.push("Step two.\n</th");
  EXPECT_EQ(d.reasoning, " Step two.");
  EXPECT_TRUE(p.in_reasoning());
  d = p.push("ink>\n\nOK");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "OK");
  EXPECT_FALSE(p.in_reasoning());
}

}  // namespace
}  // namespace deltaflow::text
