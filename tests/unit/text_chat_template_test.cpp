// Chat rendering against transformers: tests/fixtures/chat_goldens/*.json are conversations rendered by
// tokenizer.apply_chat_template(tokenize=False) (tools/reference/chat_goldens.py) with the Qwen3.5, the
// Unsloth Qwen3.6 and the Qwen3 templates. Plus template discovery in model directories and the OpenAI
// request-body entry point.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "text/chat_template.hpp"

namespace {

namespace fs = std::filesystem;
using deltaflow::text::ChatRenderOptions;
using deltaflow::text::ChatTemplate;
using Json = nlohmann::ordered_json;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out << text;
}

Json load(const std::string& name) {
  return Json::parse(slurp(fs::path(DF_FIXTURES) / "chat_goldens" / (name + ".json")));
}

void check_goldens(const std::string& name) {
  Json doc = load(name);
  auto tmpl = ChatTemplate::from_source(doc["template"].get<std::string>(), doc["special_tokens"]);
  ASSERT_TRUE(tmpl) << tmpl.message();
  const Json& cases = doc["cases"];
  ASSERT_GE(cases.size(), 30u);
  int passed = 0;
  for (const auto& c : cases) {
    const std::string cname = c["name"];
    ChatRenderOptions opt;
    opt.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    opt.tools = c["tools"];
    opt.kwargs = c["kwargs"];
    if (c.contains("continue_final_message")) {
      const Json& cf = c["continue_final_message"];
      opt.continue_final_message = cf.is_string() ? cf.get<std::string>() : (cf.get<bool>() ? "content" : "");
    }
    auto r = deltaflow::text::render_chat(*tmpl, c["messages"], opt);
    if (c.contains("expected")) {
      if (!r) {
        ADD_FAILURE() << name << "/" << cname << ": unexpected error: " << r.message();
        continue;
      }
      if (*r != c["expected"].get<std::string>()) {
        ADD_FAILURE() << name << "/" << cname << ":\n  want " << Json(c["expected"]).dump() << "\n  got  "
                      << Json(*r).dump();
        continue;
      }
    } else {
      if (r) {
        ADD_FAILURE() << name << "/" << cname << ": expected " << c["error"].dump() << ", got "
                      << Json(*r).dump();
        continue;
      }
      const std::string type = c["error"]["type"];
      const std::string msg = c["error"]["message"];
      // raise_exception text, jinja2's messages and HF's ValueErrors must come through.
      if (type == "TemplateError" || type == "ValueError" || type == "UndefinedError") {
        EXPECT_NE(r.message().find(msg), std::string::npos) << name << "/" << cname << ": " << r.message();
      }
    }
    ++passed;
  }
  EXPECT_EQ(passed, static_cast<int>(cases.size())) << name;
}

TEST(ChatGoldens, Qwen35) {
  check_goldens("qwen3.5");
}
TEST(ChatGoldens, Qwen36Unsloth) {
  check_goldens("qwen3.6-unsloth");
}
TEST(ChatGoldens, Qwen3) {
  check_goldens("qwen3");
}

TEST(ChatGoldens, TemplateErrorsCarryPosition) {
  Json doc = load("qwen3.5");
  auto tmpl = ChatTemplate::from_source(doc["template"].get<std::string>(), doc["special_tokens"]);
  ASSERT_TRUE(tmpl);
  Json msgs = Json::array(
      {Json{{"role", "system"}, {"content", "late"}}, Json{{"role", "assistant"}, {"content", "x"}}});
  deltaflow::text::jinja::TemplateError e;
  auto r = deltaflow::text::render_chat(*tmpl, msgs, Json(), true, Json(), &e);
  ASSERT_FALSE(r);
  EXPECT_EQ(e.type, "TemplateError");
  EXPECT_EQ(e.message, "No user query found in messages.");
  EXPECT_EQ(e.line, 79);  // {{- raise_exception('No user query found in messages.') }}
  EXPECT_EQ(r.message().rfind("chat template 79:", 0), 0u) << r.message();
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("df_chat_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

const Json kHello = Json::array({Json{{"role", "user"}, {"content", "hi"}}});

TEST(ChatTemplateLoad, JinjaFileWinsOverTokenizerConfig) {
  TempDir d;
  spit(d.path() / "chat_template.jinja", "file:{{ messages[0].content }}{{ eos_token }}");
  spit(d.path() / "tokenizer_config.json",
       R"({"chat_template": "config", "eos_token": {"__type": "AddedToken", "content": "<|im_end|>"},
           "bos_token": null, "image_token": "<|image_pad|>", "chat_template_kwargs": 1})");
  auto t = ChatTemplate::load(d.path().string());
  ASSERT_TRUE(t) << t.message();
  EXPECT_EQ(t->special_tokens(), Json({{"eos_token", "<|im_end|>"}, {"image_token", "<|image_pad|>"}}));
  auto r = deltaflow::text::render_chat(*t, kHello, Json(), false, Json());
  ASSERT_TRUE(r) << r.message();
  EXPECT_EQ(*r, "file:hi<|im_end|>");
}

TEST(ChatTemplateLoad, TokenizerConfigStringAndNamedList) {
  TempDir d;
  spit(d.path() / "tokenizer_config.json", R"({"chat_template": "s:{{ messages|length }}"})");
  auto t = ChatTemplate::load(d.path().string());
  ASSERT_TRUE(t) << t.message();
  EXPECT_EQ(*deltaflow::text::render_chat(*t, kHello, Json(), false, Json()), "s:1");

  TempDir e;
  spit(
      e.path() / "tokenizer_config.json",
      R"({"chat_template": [{"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools:{{ tools|length }}"}]})");
  auto n = ChatTemplate::load(e.path().string());
  ASSERT_TRUE(n) << n.message();
  EXPECT_EQ(*deltaflow::text::render_chat(*n, kHello, Json(), false, Json()), "plain");
  Json tools = Json::array({Json{{"type", "function"}}});
  EXPECT_EQ(*deltaflow::text::render_chat(*n, kHello, tools, false, Json()), "tools:1");
  // HF picks tool_use whenever tools is not None, even an empty list.
  EXPECT_EQ(*deltaflow::text::render_chat(*n, kHello, Json::array(), false, Json()), "tools:0");
}

TEST(ChatTemplateLoad, AdditionalTemplatesFormANamedSet) {
  TempDir d;
  spit(d.path() / "chat_template.jinja", "main");
  spit(d.path() / "additional_chat_templates" / "tool_use.jinja", "tool");
  auto t = ChatTemplate::load(d.path().string());
  ASSERT_TRUE(t) << t.message();
  EXPECT_EQ(*deltaflow::text::render_chat(*t, kHello, Json(), false, Json()), "main");
  EXPECT_EQ(*deltaflow::text::render_chat(*t, kHello, Json::array(), false, Json()), "tool");
}

TEST(ChatTemplateLoad, Errors) {
  TempDir d;
  EXPECT_FALSE(ChatTemplate::load(d.path().string()));  // no template anywhere
  spit(d.path() / "chat_template.jinja", "{% if %}");
  auto t = ChatTemplate::load(d.path().string());
  ASSERT_FALSE(t);
  EXPECT_NE(t.message().find("1:7"), std::string::npos) << t.message();
  EXPECT_FALSE(ChatTemplate::load((d.path() / "missing").string()));
}

TEST(ChatTemplateLoad, RealQwen3TokenizerDirectory) {
  // The shared Qwen3 tokenizer directory, when this checkout sits next to it.
  fs::path dir = fs::path(DF_SOURCE_DIR) / ".." / "shared" / "data" / "qwen3-tokenizer";
  if (!fs::exists(dir / "tokenizer_config.json")) GTEST_SKIP() << "no shared data next to the repo";
  auto t = ChatTemplate::load(dir.string());
  ASSERT_TRUE(t) << t.message();
  Json doc = load("qwen3");
  EXPECT_EQ(t->special_tokens(), doc["special_tokens"]);
  auto r = deltaflow::text::render_chat(*t, doc["cases"][0]["messages"], Json(), true, Json());
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, doc["cases"][0]["expected"].get<std::string>());
}

TEST(ChatRequest, OpenAIBodyDefaultsAndKwargs) {
  auto t = ChatTemplate::from_source(
      "{{ messages|length }}|{{ add_generation_prompt }}|{{ enable_thinking }}|{{ tools }}|{{ x }}");
  ASSERT_TRUE(t);
  Json body = {{"model", "m"}, {"messages", kHello}};
  EXPECT_EQ(*deltaflow::text::render_chat_request(*t, body), "1|True||None|");
  body["enable_thinking"] = false;
  body["add_generation_prompt"] = false;
  EXPECT_EQ(*deltaflow::text::render_chat_request(*t, body), "1|False|False|None|");
  body["chat_template_kwargs"] = {{"enable_thinking", true}, {"x", "y"}};
  body["tools"] = Json::array();
  EXPECT_EQ(*deltaflow::text::render_chat_request(*t, body), "1|False|True|[]|y");
  body["chat_template_kwargs"] = {{"messages", 1}};
  EXPECT_FALSE(deltaflow::text::render_chat_request(*t, body));
  EXPECT_FALSE(deltaflow::text::render_chat_request(*t, Json{{"model", "m"}}));
  EXPECT_FALSE(deltaflow::text::render_chat_request(*t, Json{{"messages", Json::array()}}));
}

TEST(ChatRequest, ToolArgumentsKeepRequestKeyOrder) {
  auto t = ChatTemplate::from_source("{% for t in tools %}{{ t | tojson }}{% endfor %}");
  ASSERT_TRUE(t);
  Json body = Json::parse(R"({"messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}]})");
  EXPECT_EQ(*deltaflow::text::render_chat_request(*t, body),
            R"({"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}})");
}

TEST(ChatRequest, ParseToolCallArgumentsLikeTransformersServe) {
  Json msgs = Json::parse(R"([{"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2]}"}},
      {"name": "g", "arguments": "not json"}]}])");
  Json out = deltaflow::text::parse_tool_call_arguments(msgs);
  EXPECT_EQ(out[0]["tool_calls"][0]["function"]["arguments"], Json::parse(R"({"b": 1, "a": [2]})"));
  EXPECT_EQ(out[0]["tool_calls"][0]["function"]["arguments"].begin().key(), "b");
  EXPECT_EQ(out[0]["tool_calls"][1]["arguments"], "not json");

  // With parsed arguments, Qwen3.5 renders the string-argument conversation like the object one.
  Json doc = load("qwen3.5");
  auto tmpl = ChatTemplate::from_source(doc["template"].get<std::string>(), doc["special_tokens"]);
  ASSERT_TRUE(tmpl);
  for (const auto& c : doc["cases"]) {
    if (c["name"] != "tool_call_string_args") continue;
    auto raw = deltaflow::text::render_chat(*tmpl, c["messages"], c["tools"], true, c["kwargs"]);
    EXPECT_FALSE(raw);  // transformers' apply_chat_template fails on a string here, and so do we
    auto parsed = deltaflow::text::render_chat(
        *tmpl, deltaflow::text::parse_tool_call_arguments(c["messages"]), c["tools"], true, c["kwargs"]);
    ASSERT_TRUE(parsed) << parsed.message();
    EXPECT_NE(parsed->find("<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>"),
              std::string::npos)
        << *parsed;
    // The OpenAI-body entry point parses them itself, as transformers serve and vLLM do.
    Json body = {{"messages", c["messages"]}, {"tools", c["tools"]}};
    auto via_body = deltaflow::text::render_chat_request(*tmpl, body);
    ASSERT_TRUE(via_body) << via_body.message();
    EXPECT_EQ(*via_body, *parsed);
  }
}

// `deltaflow tokenize --chat`: the exact prompt on stdout (nothing added), one error line and a non-zero
// exit on template errors. Skipped when the binary has not been built.
struct RunResult {
  int status = -1;
  std::string out, err;
};

RunResult run_cli(const std::string& args) {
  RunResult r;
  TempDir d;
  fs::path err = d.path() / "stderr.txt";
  std::string cmd = std::string(DF_BINARY) + " tokenize " + args + " 2> " + err.string();
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  r.status = pclose(p);
  r.err = slurp(err);
  return r;
}

TEST(ChatCli, TokenizeChatPrintsThePromptExactly) {
  if (!fs::exists(DF_BINARY)) GTEST_SKIP() << "deltaflow not built";
  Json doc = load("qwen3.5");
  TempDir d;
  spit(d.path() / "model" / "chat_template.jinja", doc["template"].get<std::string>());
  spit(d.path() / "model" / "tokenizer_config.json",
       R"({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})");
  for (const auto& c : doc["cases"]) {
    if (c["name"] != "tool_call_object_args" && c["name"] != "thinking_off") continue;
    Json body = {{"model", "m"}, {"messages", c["messages"]}};
    if (!c["tools"].is_null()) body["tools"] = c["tools"];
    if (!c["kwargs"].empty()) body["chat_template_kwargs"] = c["kwargs"];
    spit(d.path() / "req.json", body.dump());
    RunResult r =
        run_cli("--model " + (d.path() / "model").string() + " --chat " + (d.path() / "req.json").string());
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, c["expected"].get<std::string>()) << c["name"];
  }
  // A template error: non-zero, one line on stderr with the raise_exception text.
  spit(d.path() / "bad.json", R"({"messages": [{"role": "assistant", "content": "x"}]})");
  RunResult bad =
      run_cli("--model " + (d.path() / "model").string() + " --chat " + (d.path() / "bad.json").string());
  EXPECT_NE(bad.status, 0);
  EXPECT_TRUE(bad.out.empty());
  EXPECT_EQ(bad.err, "deltaflow tokenize: chat template 79:24: No user query found in messages.\n");
  // --chat-template overrides the model's template.
  spit(d.path() / "other.jinja", "{{ messages[0].content }}{{ eos_token }}");
  RunResult o =
      run_cli("--model " + (d.path() / "model").string() + " --chat " + (d.path() / "bad.json").string() +
              " --chat-template " + (d.path() / "other.jinja").string());
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_EQ(o.out, "x<|im_end|>");
}

}  // namespace
