// The per-choice output pipeline on the tiny tokenizer: ids -> text -> stop strings -> reasoning -> tools.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/embedded_assets.hpp"
#include "server/choice_output.hpp"
#include "server/metrics.hpp"

namespace deltaflow::server {
namespace {

const text::Tokenizer& tiny_tokenizer() {
  static const text::Tokenizer tok = [] {
    std::string_view json, config;
    for (const auto& a : model::tiny_tokenizer_assets()) {
      if (std::string(a.name) == "tokenizer.json") json = a.text;
      if (std::string(a.name) == "tokenizer_config.json") config = a.text;
    }
    auto t = text::Tokenizer::load_from_json_text(json, config);
    if (!t) throw std::runtime_error(t.message());
    return std::move(*t);
  }();
  return tok;
}

struct Result {
  std::string reasoning, content;
  std::vector<text::ToolCall> calls;
  bool stopped = false;
  int deltas_with_text = 0;
};

Result run(const std::string& output, OutputOptions o) {
  const auto& tok = tiny_tokenizer();
  ChoiceOutput out(tok, std::move(o));
  Result r;
  auto take = [&](OutputDelta d) {
    if (!d.content.empty() || !d.reasoning.empty()) ++r.deltas_with_text;
    r.reasoning += d.reasoning;
    r.content += d.content;
    for (auto& c : d.calls) {
      if (c.begin) r.calls.push_back({c.name, ""});
      r.calls.back().arguments += c.arguments;
    }
  };
  take(out.start());
  for (int32_t id : tok.encode(output)) {
    take(out.feed({id, 0.0f, {}}, false));
    if (out.stopped_by_string()) {
      r.stopped = true;
      break;
    }
  }
  take(out.finish());
  return r;
}

TEST(ServerChoiceOutput, PlainTextRoundTrips) {
  const std::string s = "Hello, world! caf\xc3\xa9 and more text.";
  auto r = run(s, {});
  EXPECT_EQ(r.content, s);
  EXPECT_GT(r.deltas_with_text, 3);  // streamed piece by piece, not at the end
}

TEST(ServerChoiceOutput, StopStringAcrossTokensIsCutAndNotShown) {
  OutputOptions o;
  o.stop = {"world! ca"};
  auto r = run("Hello, world! caf\xc3\xa9", o);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.content, "Hello, ");
}

TEST(ServerChoiceOutput, ReasoningThenToolCall) {
  OutputOptions o;
  o.reasoning = true;
  o.in_reasoning = true;
  o.tools = true;
  o.tool_specs = {{"get_weather", {{"city", {"string"}}, {"days", {"integer"}}}}};
  auto r =
      run("Let me check.\n</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
          "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
          o);
  EXPECT_EQ(r.reasoning, "Let me check.");
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(r.calls[0].arguments), (nlohmann::json{{"city", "Paris"}, {"days", 2}}));
}

TEST(ServerChoiceOutput, NamedToolPrefixYieldsTheNameFirst) {
  OutputOptions o;
  o.tools = true;
  o.tool_specs = {{"search", {{"q", {"string"}}}}};
  o.tool_prefix = "<tool_call>\n<function=search>\n";
  const auto& tok = tiny_tokenizer();
  ChoiceOutput out(tok, o);
  auto first = out.start();
  ASSERT_EQ(first.calls.size(), 1u);
  EXPECT_EQ(first.calls[0].name, "search");
  auto r = run("<parameter=q>\ncats\n</parameter>\n</function>\n</tool_call>", o);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"q\": \"cats\"}");
  EXPECT_EQ(out.tool_calls(), 1);
}

TEST(ServerChoiceOutput, StopTokenHasNoTextButCounts) {
  const auto& tok = tiny_tokenizer();
  ChoiceOutput out(tok, {});
  auto d = out.feed({tok.encode("Hi")[0], -0.5f, {}}, false);
  auto s = out.feed({*tok.token_to_id("<|im_end|>"), -0.1f, {}}, true);
  EXPECT_TRUE(s.content.empty());
  EXPECT_TRUE(s.tokens.empty());
  EXPECT_EQ(out.tokens_used(), 2);
  EXPECT_EQ(d.tokens.size(), 1u);
}

TEST(ServerMetrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(0.7);
  h.observe(3.0);
  std::string out;
  h.render("x", out);
  EXPECT_NE(out.find("x_bucket{le=\"0.1\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"1\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"+Inf\"} 4\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_count 4\n"), std::string::npos) << out;
  Metrics m;
  m.request("/v1/completions", 200);
  m.tokens(10, 5, 0);
  const std::string text = m.render({3, 1, true});
  EXPECT_NE(text.find("deltaflow_http_requests_total{route=\"/v1/completions\",status=\"200\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("deltaflow_num_requests_waiting 3"), std::string::npos);
  EXPECT_NE(text.find("deltaflow_generation_tokens_total 5"), std::string::npos);
}

}  // namespace
}  // namespace deltaflow::server
