// Request fields -> native parameters: defaults, ranges, types, and the field named in each error.
#include <gtest/gtest.h>

#include "server/request_params.hpp"

namespace deltaflow::server {
namespace {

GenerationDefaults qwen_defaults() {
  GenerationDefaults d;
  d.temperature = 0.6f;
  d.top_k = 20;
  d.top_p = 0.95f;
  return d;
}

GenParams ok(const Json& body, Api api = Api::kChat, bool hooks = false) {
  auto r = parse_gen_params(body, api, qwen_defaults(), 1024, hooks);
  EXPECT_TRUE(std::holds_alternative<GenParams>(r)) << std::get<ApiError>(r).message;
  return std::holds_alternative<GenParams>(r) ? std::get<GenParams>(r) : GenParams{};
}

std::string bad(const Json& body, Api api = Api::kChat) {
  auto r = parse_gen_params(body, api, qwen_defaults(), 1024, false);
  if (!std::holds_alternative<ApiError>(r)) return "<accepted>";
  EXPECT_EQ(std::get<ApiError>(r).status, 400);
  return std::get<ApiError>(r).param;
}

TEST(ServerParams, DefaultsComeFromGenerationConfig) {
  auto p = ok(Json::object());
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.6f);
  EXPECT_EQ(p.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 0.95f);
  EXPECT_FALSE(p.max_tokens.has_value());
  EXPECT_FALSE(p.seed_given);
  EXPECT_EQ(p.n, 1);
}

TEST(ServerParams, RequestOverrides) {
  auto p = ok(Json::parse(R"({"temperature": 0, "top_k": -1, "top_p": 0.5, "min_p": 0.1, "seed": -3,
                              "max_tokens": 10, "max_completion_tokens": 7, "stop": "END", "n": 2,
                              "presence_penalty": 1.5, "repetition_penalty": 1.1, "ignore_eos": true,
                              "logprobs": true, "top_logprobs": 4, "stop_token_ids": [5, 6],
                              "thinking_token_budget": 64})"));
  EXPECT_EQ(p.sampling.temperature, 0.0f);
  EXPECT_EQ(p.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(p.sampling.min_p, 0.1f);
  EXPECT_TRUE(p.seed_given);
  EXPECT_EQ(p.sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(*p.max_tokens, 7);  // max_completion_tokens wins in chat
  EXPECT_EQ(p.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(p.n, 2);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.top_logprobs, 4);
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(*p.thinking_budget, 64);
}

TEST(ServerParams, BadFieldsAreNamed) {
  EXPECT_EQ(bad(Json::parse(R"({"temperature": "hot"})")), "temperature");
  EXPECT_EQ(bad(Json::parse(R"({"temperature": 2.5})")), "temperature");
  EXPECT_EQ(bad(Json::parse(R"({"top_p": 0})")), "top_p");
  EXPECT_EQ(bad(Json::parse(R"({"top_k": true})")), "top_k");
  EXPECT_EQ(bad(Json::parse(R"({"max_tokens": 0})")), "max_tokens");
  EXPECT_EQ(bad(Json::parse(R"({"max_tokens": 1.5})")), "max_tokens");
  EXPECT_EQ(bad(Json::parse(R"({"seed": 1.5})")), "seed");
  EXPECT_EQ(bad(Json::parse(R"({"stop": [1]})")), "stop");
  EXPECT_EQ(bad(Json::parse(R"({"stop_token_ids": [2000]})")), "stop_token_ids");
  EXPECT_EQ(bad(Json::parse(R"({"n": 17})")), "n");
  EXPECT_EQ(bad(Json::parse(R"({"top_logprobs": 3})")), "top_logprobs");
  EXPECT_EQ(bad(Json::parse(R"({"deltaflow_forced_tokens": "x"})")), "deltaflow_forced_tokens");
  EXPECT_EQ(bad(Json::parse(R"({"echo": 1})"), Api::kCompletions), "echo");
  EXPECT_EQ(bad(Json::parse(R"({"suffix": "x"})"), Api::kCompletions), "suffix");
  EXPECT_EQ(bad(Json::parse(R"({"max_tokens": -1})"), Api::kCompletions), "max_tokens");
  EXPECT_EQ(bad(Json::parse(R"({"logit_bias": [1]})")), "logit_bias");
  EXPECT_EQ(bad(Json::parse(R"({"logit_bias": {"x": 1}})")), "logit_bias");
  EXPECT_EQ(bad(Json::parse(R"({"logit_bias": {"1024": 1}})")), "logit_bias");
  EXPECT_EQ(bad(Json::parse(R"({"logit_bias": {"5": 101}})")), "logit_bias");
  EXPECT_EQ(bad(Json::parse(R"({"logit_bias": {"5": "1"}})")), "logit_bias");
  EXPECT_EQ(bad(Json::parse(R"({"best_of": 3})")), "best_of");  // chat: a completions field
  EXPECT_EQ(bad(Json::parse(R"({"n": 3, "best_of": 2})"), Api::kCompletions), "best_of");
  EXPECT_EQ(bad(Json::parse(R"({"prompt_logprobs": 21})")), "prompt_logprobs");
  EXPECT_EQ(bad(Json::parse(R"({"logprobs": true})"), Api::kCompletions), "logprobs");
  EXPECT_EQ(bad(Json::parse(R"({"options": {"temperature": "x"}})"), Api::kOllama), "options.temperature");
  EXPECT_EQ(bad(Json::parse(R"({"options": 3})"), Api::kOllama), "options");
}

TEST(ServerParams, OpenAIFieldsForTools) {
  auto p = ok(Json::parse(R"({"echo": true, "max_tokens": 0, "suffix": "", "best_of": 4, "n": 2,
                              "logit_bias": {"7": 100, "12": -5.5}, "prompt_logprobs": 3, "logprobs": 1})"),
              Api::kCompletions);
  EXPECT_TRUE(p.echo);
  EXPECT_EQ(*p.max_tokens, 0);
  EXPECT_EQ(p.best_of, 4);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(*p.prompt_logprobs, 3);
  EXPECT_EQ(p.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{7, 100.0f}, {12, -5.5f}}));
  EXPECT_EQ(ok(Json::object(), Api::kCompletions).best_of, 1);
  EXPECT_EQ(ok(Json::parse(R"({"n": 3})"), Api::kCompletions).best_of, 3);
}

TEST(ServerParams, OllamaOptions) {
  auto p = ok(Json::parse(R"({"options": {"temperature": 0.2, "num_predict": 12, "repeat_penalty": 1.2,
                                          "stop": ["x"], "seed": 5, "num_ctx": 8192}})"),
              Api::kOllama);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.2f);
  EXPECT_EQ(*p.max_tokens, 12);
  EXPECT_FLOAT_EQ(p.sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(p.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(p.sampling.seed, 5u);
  EXPECT_FALSE(ok(Json::parse(R"({"options": {"num_predict": -1}})"), Api::kOllama).max_tokens.has_value());
}

TEST(ServerParams, TestHookOnlyWhenEnabled) {
  auto p = ok(Json::parse(R"({"deltaflow_forced_tokens": "<tool_call>"})"), Api::kChat, true);
  EXPECT_EQ(*p.forced_text, "<tool_call>");
}

TEST(ServerParams, BodyParsing) {
  EXPECT_TRUE(std::holds_alternative<Json>(parse_body(R"({"a": [1, {"b": "]]]]"}]})")));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_body("{")));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_body("[]")));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_body("")));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_body("\xff")));
  std::string deep = "{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}";
  auto r = parse_body(deep);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_NE(std::get<ApiError>(r).message.find("deeper"), std::string::npos);
  // Brackets inside strings do not count.
  EXPECT_TRUE(std::holds_alternative<Json>(parse_body("{\"a\": \"" + std::string(500, '[') + "\"}")));
}

TEST(ServerParams, ToolSchemasGiveParameterTypes) {
  auto r = parse_tools(Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
      "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": ["number", "null"]},
      "c": {"anyOf": [{"type": "string"}, {"type": "boolean"}]}, "d": {"enum": ["x", "y"]}, "e": {}}}}}])"));
  ASSERT_TRUE(std::holds_alternative<std::vector<text::ToolSpec>>(r));
  const auto& t = std::get<std::vector<text::ToolSpec>>(r)[0];
  EXPECT_EQ(t.name, "f");
  EXPECT_EQ(t.param_types.at("a"), std::vector<std::string>{"integer"});
  EXPECT_EQ(t.param_types.at("b"), (std::vector<std::string>{"number", "null"}));
  EXPECT_EQ(t.param_types.at("c"), (std::vector<std::string>{"string", "boolean"}));
  EXPECT_EQ(t.param_types.at("d"), std::vector<std::string>{"string"});
  EXPECT_TRUE(t.param_types.at("e").empty());
  auto bad_tool = parse_tools(Json::parse(R"([{"type": "function", "function": {"parameters": {}}}])"));
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad_tool));
  EXPECT_EQ(std::get<ApiError>(bad_tool).param, "tools[0].function.name");
}

TEST(ServerParams, MessagesForTheTemplate) {
  auto r = normalize_messages(Json::parse(R"([{"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hi"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "done"}])"));
  ASSERT_TRUE(std::holds_alternative<Json>(r)) << std::get<ApiError>(r).message;
  const Json& m = std::get<Json>(r);
  EXPECT_EQ(m[0]["role"], "system");
  EXPECT_TRUE(m[2]["tool_calls"][0]["function"]["arguments"].is_object());
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"]["a"], 1);
  auto bad_args = normalize_messages(Json::parse(
      R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}])"));
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad_args));
  EXPECT_EQ(std::get<ApiError>(bad_args).param, "messages[0].tool_calls[0].function.arguments");
  // image_url parts go to the template (server/image_inputs.cpp loads them); they need a URL.
  auto image = normalize_messages(Json::parse(R"([{"role": "user", "content": [{"type": "image_url"}]}])"));
  ASSERT_TRUE(std::holds_alternative<ApiError>(image));
  EXPECT_EQ(std::get<ApiError>(image).param, "messages[0].content[0].image_url");
  EXPECT_TRUE(std::holds_alternative<Json>(normalize_messages(Json::parse(
      R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}])"))));
  auto audio = normalize_messages(Json::parse(R"([{"role": "user", "content": [{"type": "input_audio"}]}])"));
  ASSERT_TRUE(std::holds_alternative<ApiError>(audio));
  EXPECT_EQ(std::get<ApiError>(audio).param, "messages[0].content[0].type");
}

}  // namespace
}  // namespace deltaflow::server
