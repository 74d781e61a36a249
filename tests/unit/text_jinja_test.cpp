// The Jinja engine against jinja2 itself: tests/fixtures/jinja_goldens.json holds snippets rendered by
// tools/reference/jinja_goldens.py in the environment transformers uses for chat templates. Plus error
// positions, limits and the sandbox rules, which the goldens cannot express.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "text/jinja/template.hpp"

namespace {

using deltaflow::text::jinja::Limits;
using deltaflow::text::jinja::Template;
using deltaflow::text::jinja::TemplateError;
using deltaflow::text::jinja::Value;
using Json = nlohmann::ordered_json;

Json load_goldens() {
  std::ifstream in(std::string(DF_FIXTURES) + "/jinja_goldens.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

struct Outcome {
  bool ok = false;
  std::string text;
  TemplateError error;
};

Outcome run(const std::string& source, const Json& context, const Limits& limits = {}) {
  Outcome o;
  auto t = Template::parse(source, limits, &o.error);
  if (!t) return o;
  auto r = t->render(context, &o.error);
  if (!r) return o;
  o.ok = true;
  o.text = *r;
  return o;
}

TEST(JinjaGoldens, EverySnippetMatchesJinja2) {
  Json doc = load_goldens();
  const Json& cases = doc["cases"];
  ASSERT_GE(cases.size(), 60u);
  int failures = 0;
  for (const auto& c : cases) {
    std::string name = c["name"];
    Outcome o = run(c["template"].get<std::string>(), c["context"]);
    if (c.contains("expected")) {
      std::string want = c["expected"];
      if (!o.ok) {
        ADD_FAILURE() << name << ": expected output " << Json(want).dump() << ", got error " << o.error.type
                      << ": " << o.error.to_string();
        ++failures;
      } else if (o.text != want) {
        ADD_FAILURE() << name << ":\n  want " << Json(want).dump() << "\n  got  " << Json(o.text).dump();
        ++failures;
      }
    } else {
      const Json& err = c["error"];
      if (o.ok) {
        ADD_FAILURE() << name << ": expected " << err.dump() << ", got output " << Json(o.text).dump();
        ++failures;
        continue;
      }
      std::string type = err["type"];
      // raise_exception text and the common jinja2 messages must come through verbatim.
      if (type == "TemplateError" || type == "UndefinedError" || type == "SecurityError" ||
          type == "TemplateAssertionError") {
        EXPECT_EQ(o.error.message, err["message"].get<std::string>()) << name;
      }
      if (type == "TemplateSyntaxError" || type == "TemplateAssertionError" || type == "TemplateError") {
        if (err["line"].is_number()) {
          EXPECT_EQ(o.error.line, err["line"].get<int>()) << name << ": " << o.error.to_string();
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(JinjaErrors, SyntaxErrorsCarryLineAndColumn) {
  TemplateError e;
  auto t = Template::parse("line one\n  {{ 1 + }}\n", {}, &e);
  ASSERT_FALSE(t);
  EXPECT_EQ(e.type, "TemplateSyntaxError");
  EXPECT_EQ(e.line, 2);
  EXPECT_EQ(e.column, 10);  // the "}}" after the dangling "+"
  EXPECT_NE(t.message().find("2:10:"), std::string::npos) << t.message();

  auto u = Template::parse("ab\ncd {% if x %}\n", {}, &e);
  ASSERT_FALSE(u);
  EXPECT_EQ(e.line, 2);
  EXPECT_NE(e.message.find("Unexpected end of template"), std::string::npos);
}

TEST(JinjaErrors, RuntimeErrorsPointAtTheExpression) {
  TemplateError e;
  auto t = Template::parse("héllo\n{{ 'x' ~ 1 }} {{ 'a' + 1 }}");
  ASSERT_TRUE(t);
  auto r = t->render(Json::object(), &e);
  ASSERT_FALSE(r);
  EXPECT_EQ(e.type, "TypeError");
  EXPECT_EQ(e.line, 2);
  EXPECT_EQ(e.column, 22);  // the '+'
  EXPECT_EQ(e.message, "can only concatenate str (not \"int\") to str");
}

TEST(JinjaErrors, RaiseExceptionMessageAndPosition) {
  TemplateError e;
  auto t = Template::parse(
      "{%- if not messages %}\n    {{- raise_exception('No messages provided.') }}\n{%- endif %}");
  ASSERT_TRUE(t);
  auto r = t->render(Json{{"messages", Json::array()}}, &e);
  ASSERT_FALSE(r);
  EXPECT_EQ(e.type, "TemplateError");
  EXPECT_EQ(e.message, "No messages provided.");
  EXPECT_EQ(e.line, 2);
  EXPECT_EQ(e.column, 24);  // the call's "("
  EXPECT_EQ(r.message(), "2:24: No messages provided.");
}

TEST(JinjaLimits, MacroRecursionIsBounded) {
  Limits lim;
  lim.max_call_depth = 20;
  Outcome o = run("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", Json::object(), lim);
  ASSERT_FALSE(o.ok);
  EXPECT_EQ(o.error.type, "LimitError");
  Outcome fine =
      run("{% macro f(n) %}{% if n < 10 %}{{ f(n + 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(0) }}",
          Json::object(), lim);
  ASSERT_TRUE(fine.ok) << fine.error.to_string();
  EXPECT_EQ(fine.text, "109876543210");
}

TEST(JinjaLimits, LoopIterationsAreBounded) {
  Limits lim;
  lim.max_loop_iterations = 1000;
  Outcome o =
      run("{% for i in range(100) %}{% for j in range(100) %}x{% endfor %}{% endfor %}", Json::object(), lim);
  ASSERT_FALSE(o.ok);
  EXPECT_EQ(o.error.type, "LimitError");
  EXPECT_TRUE(
      run("{% for i in range(30) %}{% for j in range(30) %}{% endfor %}{% endfor %}", Json::object(), lim)
          .ok);
}

TEST(JinjaLimits, OutputAndStringSizeAreBounded) {
  Limits lim;
  lim.max_output_bytes = 1000;
  Outcome o = run("{% for i in range(200) %}0123456789{% endfor %}", Json::object(), lim);
  ASSERT_FALSE(o.ok);
  EXPECT_EQ(o.error.type, "LimitError");
  Outcome big = run("{% set s = 'ab' * 100000 %}{{ s | length }}", Json::object(), lim);
  ASSERT_FALSE(big.ok);
  EXPECT_EQ(big.error.type, "LimitError");
}

TEST(JinjaLimits, StepsAreBounded) {
  Limits lim;
  lim.max_steps = 5000;
  Outcome o = run("{% for i in range(10000) %}{% endfor %}", Json::object(), lim);
  ASSERT_FALSE(o.ok);
  EXPECT_EQ(o.error.type, "LimitError");
}

TEST(JinjaLimits, NestingIsBounded) {
  std::string deep(500, '(');
  deep = "{{ " + deep + "1" + std::string(500, ')') + " }}";
  Outcome o = run(deep, Json::object());
  ASSERT_FALSE(o.ok);
  EXPECT_EQ(o.error.type, "LimitError");
  std::string blocks;
  for (int i = 0; i < 300; ++i) blocks += "{% if true %}";
  Outcome b = run(blocks, Json::object());
  ASSERT_FALSE(b.ok);
  EXPECT_EQ(b.error.type, "LimitError");
}

TEST(JinjaSandbox, NoFileAccessAndNoDunderAttributes) {
  for (const char* src :
       {"{% include 'x' %}", "{% import 'x' as y %}", "{% from 'x' import y %}", "{% extends 'x' %}"}) {
    Outcome o = run(src, Json::object());
    EXPECT_FALSE(o.ok) << src;
  }
  // As in jinja2: an unsafe attribute is an Undefined that prints as "" but fails when used.
  Outcome p = run("[{{ ''.__class__ }}]", Json::object());
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.text, "[]");
  Outcome d = run("{{ ''.__class__.__name__ }}", Json::object());
  ASSERT_FALSE(d.ok);
  EXPECT_EQ(d.error.type, "SecurityError");
  EXPECT_EQ(d.error.message, "access to attribute '__class__' of 'str' object is unsafe.");
}

TEST(JinjaValues, TemplateCanBeRenderedManyTimesAndFromValues) {
  auto t = Template::parse(
      "{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(t);
  for (int k = 1; k < 4; ++k) {
    Value vars = Value::dict();
    std::vector<Value> xs;
    for (int i = 0; i <= k; ++i) xs.push_back(Value::integer(i));
    vars.dict_data().set(Value::string("xs"), Value::list(xs));
    auto r = t->render(vars);
    ASSERT_TRUE(r);
    EXPECT_EQ(*r, std::to_string(k * (k + 1) / 2));
  }
}

}  // namespace
