// Tool-call parsing on outputs in the shapes Qwen3.5 (XML, as its chat template renders calls) and Qwen3
// (hermes JSON) models produce, whole and streamed in every split.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "text/reasoning_parser.hpp"
#include "text/tool_call_parser.hpp"

namespace deltaflow::text {
namespace {

using nlohmann::json;

std::vector<ToolSpec> weather_tools() {
  ToolSpec w{"get_weather", {{"city", {"string"}}, {"days", {"integer"}}, {"metric", {"boolean"}}}};
  ToolSpec s{"search",
             {{"query", {"string"}},
              {"limit", {"integer", "null"}},
              {"filters", {"object"}},
              {"tags", {"array"}},
              {"threshold", {"number"}}}};
  return {w, s};
}

// What streaming the text in the given pieces produces, merged into whole calls.
ParsedToolCalls stream(const std::vector<std::string>& pieces, const std::vector<ToolSpec>& tools,
                       std::vector<std::string>* content_deltas = nullptr) {
  ToolCallParser p(tools);
  ParsedToolCalls r;
  auto take = [&](ToolParseDelta d) {
    if (content_deltas && !d.content.empty()) content_deltas->push_back(d.content);
    r.content += d.content;
    for (auto& c : d.calls) {
      if (c.begin) {
        EXPECT_EQ(c.index, static_cast<int>(r.calls.size()));
        r.calls.push_back({c.name, ""});
      }
      EXPECT_LT(static_cast<size_t>(c.index), r.calls.size());
      if (static_cast<size_t>(c.index) < r.calls.size()) r.calls[c.index].arguments += c.arguments;
    }
  };
  for (const auto& piece : pieces) take(p.push(piece));
  take(p.finish());
  return r;
}

std::vector<std::string> chars(const std::string& s) {
  std::vector<std::string> v;
  for (char c : s) v.emplace_back(1, c);
  return v;
}

// Checks the whole-text parse against the expectation, then every 1- and 2-cut split and char-by-char.
void expect_parse(const std::string& text, const std::vector<ToolSpec>& tools, const std::string& content,
                  const std::vector<std::pair<std::string, json>>& calls) {
  auto check = [&](const ParsedToolCalls& r, const std::string& how) {
    EXPECT_EQ(r.content, content) << how;
    ASSERT_EQ(r.calls.size(), calls.size()) << how;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].name, calls[i].first) << how;
      json args = json::parse(r.calls[i].arguments, nullptr, false);
      ASSERT_FALSE(args.is_discarded()) << how << ": arguments not JSON: " << r.calls[i].arguments;
      EXPECT_EQ(args, calls[i].second) << how;
    }
  };
  check(parse_tool_calls(text, tools), "whole");
  std::vector<std::string> deltas;
  check(stream(chars(text), tools, &deltas), "char by char");
  for (const auto& d : deltas)
    EXPECT_EQ(d.find('<'), std::string::npos) << "content delta with markup: " << d;
  for (size_t a = 0; a <= text.size(); ++a) {
    check(stream({text.substr(0, a), text.substr(a)}, tools), "split at " + std::to_string(a));
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::string> pieces;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t n = 1 + rng() % 9;
      pieces.push_back(text.substr(pos, n));
      pos += n;
    }
    check(stream(pieces, tools), "random split " + std::to_string(trial));
  }
}

TEST(ToolCallParser, Qwen35XmlSingleCallTypedBySchema) {
  const std::string out =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>";
  expect_parse(out, weather_tools(), "",
               {{"get_weather", json{{"city", "Paris"}, {"days", 3}, {"metric", true}}}});
}

TEST(ToolCallParser, ContentBeforeCallAndSeveralCalls) {
  const std::string out =
      "I'll look up both "
      "cities.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York, NY\n"
      "</parameter>\n<parameter=days>\n7\n</parameter>\n</function>\n</tool_call>";
  expect_parse(out, weather_tools(), "I'll look up both cities.",
               {{"get_weather", json{{"city", "Paris"}}},
                {"get_weather", json{{"city", "New York, NY"}, {"days", 7}}}});
}

TEST(ToolCallParser, ObjectsArraysNumbersNullAndMultilineStrings) {
  const std::string out =
      "<tool_call>\n<function=search>\n<parameter=query>\nline one\nline \"two\" <b>\n</parameter>\n"
      "<parameter=limit>\nnull\n</parameter>\n<parameter=filters>\n{\"lang\": \"fr\", \"year\": 2024}\n"
      "</parameter>\n<parameter=tags>\n[\"a\", "
      "\"b\"]\n</parameter>\n<parameter=threshold>\n0.25\n</parameter>\n"
      "</function>\n</tool_call>";
  expect_parse(out, weather_tools(), "",
               {{"search", json{{"query", "line one\nline \"two\" <b>"},
                                {"limit", nullptr},
                                {"filters", {{"lang", "fr"}, {"year", 2024}}},
                                {"tags", {"a", "b"}},
                                {"threshold", 0.25}}}});
}

TEST(ToolCallParser, ValuesThatDoNotMatchTheirTypeStayStrings) {
  const std::string out =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\nthree\n"
      "</parameter>\n<parameter=unknown_param>\n{\"x\": 1}\n</parameter>\n</function>\n</tool_call>";
  expect_parse(out, weather_tools(), "",
               {{"get_weather", json{{"city", "42"}, {"days", "three"}, {"unknown_param", "{\"x\": 1}"}}}});
}

TEST(ToolCallParser, UnknownToolKeepsStringsAndNoParamsIsEmptyObject) {
  const std::string out =
      "<tool_call>\n<function=list_files>\n</function>\n</tool_call>\n<tool_call>\n<function=mystery>\n"
      "<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>";
  expect_parse(out, weather_tools(), "", {{"list_files", json::object()}, {"mystery", json{{"n", "5"}}}});
}

TEST(ToolCallParser, MissingClosingParameterAndFunctionTags) {
  // Seen from quantized models: </parameter> dropped before the next parameter, </function> dropped.
  const std::string out =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nBerlin\n<parameter=days>\n2\n</tool_call>";
  expect_parse(out, weather_tools(), "", {{"get_weather", json{{"city", "Berlin"}, {"days", 2}}}});
}

TEST(ToolCallParser, BareFunctionWithoutToolCallTag) {
  const std::string out =
      "Checking.\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>";
  expect_parse(out, weather_tools(), "Checking.", {{"get_weather", json{{"city", "Rome"}}}});
}

TEST(ToolCallParser, Qwen3HermesJson) {
  const std::string out =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\", \"days\": "
      "5}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"sushi\\\"}\"}\n</tool_call>";
  expect_parse(out, weather_tools(), "",
               {{"get_weather", json{{"city", "Tokyo"}, {"days", 5}}}, {"search", json{{"query", "sushi"}}}});
}

TEST(ToolCallParser, InvalidJsonCallIsReturnedAsContent) {
  const std::string out = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>";
  auto r = parse_tool_calls(out, weather_tools());
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, out);
}

TEST(ToolCallParser, TruncatedXmlCallIsFinishedWhenNamed) {
  const std::string out = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOsl";
  auto r = parse_tool_calls(out, weather_tools());
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.calls[0].arguments), (json{{"city", "Osl"}}));
  EXPECT_EQ(r.content, "");
}

TEST(ToolCallParser, TruncatedBeforeNameIsContent) {
  const std::string out = "Sure.<tool_call>\n<funct";
  auto r = parse_tool_calls(out, weather_tools());
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, out);
}

TEST(ToolCallParser, PlainTextWithAngleBracketsPassesThrough) {
  const std::string out = "Use a < b and <tool> or <tool_c but no call. x <function";
  auto r = parse_tool_calls(out, weather_tools());
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, out);
  // Streamed, the same text comes out.
  EXPECT_EQ(stream(chars(out), weather_tools()).content, out);
}

TEST(ToolCallParser, TextAfterACallIsContent) {
  const std::string out =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n</function>\n</"
      "tool_call>\n\n"
      "Done.";
  expect_parse(out, weather_tools(), "Done.", {{"get_weather", json{{"city", "Lima"}}}});
}

TEST(ToolCallParser, ParamValueConversion) {
  EXPECT_EQ(convert_param_value("12", {"integer"}), "12");
  EXPECT_EQ(convert_param_value("-7", {"integer"}), "-7");
  EXPECT_EQ(convert_param_value("1.5", {"integer"}), "\"1.5\"");
  EXPECT_EQ(convert_param_value("1.5", {"number"}), "1.5");
  EXPECT_EQ(convert_param_value("nan", {"number"}), "\"nan\"");
  EXPECT_EQ(convert_param_value("False", {"boolean"}), "false");
  EXPECT_EQ(convert_param_value("yes", {"boolean"}), "\"yes\"");
  EXPECT_EQ(convert_param_value("null", {"string", "null"}), "null");
  EXPECT_EQ(convert_param_value("", {"string", "null"}), "\"\"");
  EXPECT_EQ(convert_param_value("7", {"string", "integer"}), "7");
  EXPECT_EQ(convert_param_value("[1,2]", {"object"}), "\"[1,2]\"");
  EXPECT_EQ(convert_param_value("[1,2]", {"array"}), "[1,2]");
  EXPECT_EQ(convert_param_value("caf\xc3\xa9", {"string"}), "\"caf\xc3\xa9\"");
  EXPECT_EQ(convert_param_value("bad \xff byte", {"string"}), "\"bad \xef\xbf\xbd byte\"");
}

TEST(ToolCallParser, ToolCallInsideThoughtEndsTheThought) {
  // The reasoning parser hands a call written inside <think> to the content, where the tool parser finds it.
  const std::string out =
      "The user wants weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
      "</function>\n</tool_call>";
  auto split = split_reasoning(out, true);
  EXPECT_EQ(split.reasoning, "The user wants weather.");
  auto r = parse_tool_calls(split.content, weather_tools());
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].arguments), (json{{"city", "Oslo"}}));
}

TEST(ToolCallParser, StreamedArgumentsArriveBeforeTheCallEnds) {
  ToolCallParser p(weather_tools());
  auto d = p.push("<tool_call>\n<function=get_weather>\n");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_TRUE(d.calls[0].begin);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  d = p.push("<parameter=city>\nParis\n</parameter>\n");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, "{\"city\": \"Paris\"");
  d = p.push("</function>\n</tool_call>");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, "}");
  EXPECT_EQ(p.calls(), 1);
}

}  // namespace
}  // namespace deltaflow::text
