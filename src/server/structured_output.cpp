#include "server/structured_output.hpp"

#include <map>
#include <mutex>

#include "grammar/ebnf.hpp"
#include "grammar/json_schema.hpp"
#include "grammar/regex.hpp"
#include "server/grammar_constraint.hpp"

namespace deltaflow::server {

namespace {

// A schema given as an object or as JSON text (vLLM accepts both).
Json schema_field(const Json& v, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v;
  if (v.is_string()) {
    Json j = Json::parse(v.get<std::string>(), nullptr, false);
    if (!j.is_discarded() && (j.is_object() || j.is_boolean())) return j;
    throw bad_field(field, "'" + field + "' must be a JSON schema (an object, or its JSON text)");
  }
  throw bad_field(field, "'" + field + "' must be a JSON schema object");
}

std::string string_field(const Json& v, const std::string& field) {
  if (!v.is_string() || v.get<std::string>().empty())
    throw bad_field(field, "'" + field + "' must be a non-empty string");
  return v.get<std::string>();
}

std::vector<std::string> choice_field(const Json& v, const std::string& field) {
  if (!v.is_array() || v.empty())
    throw bad_field(field, "'" + field + "' must be a non-empty list of strings");
  std::vector<std::string> out;
  for (const auto& c : v) {
    if (!c.is_string() || c.get<std::string>().empty())
      throw bad_field(field, "'" + field + "' must be a non-empty list of non-empty strings");
    out.push_back(c.get<std::string>());
  }
  return out;
}

GrammarSpec response_format(const Json& rf) {
  GrammarSpec s;
  s.field = "response_format";
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    throw bad_field("response_format", "'response_format' must be an object with a 'type'");
  const std::string type = rf["type"].get<std::string>();
  if (type == "json_object") {
    s.kind = GrammarSpec::Kind::kJsonObject;
    return s;
  }
  if (type != "json_schema")
    throw bad_field(
        "response_format.type",
        "'response_format.type' must be 'text', 'json_object' or 'json_schema', not '" + type + "'");
  auto js = rf.find("json_schema");
  if (js == rf.end() || !js->is_object())
    throw bad_field("response_format.json_schema", "'response_format.json_schema' must be an object");
  auto schema = js->find("schema");
  if (schema == js->end() || schema->is_null())
    throw bad_field("response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
  s.kind = GrammarSpec::Kind::kJsonSchema;
  s.field = "response_format.json_schema.schema";
  s.schema = schema_field(*schema, s.field);
  if (auto st = js->find("strict"); st != js->end() && !st->is_null()) {
    if (!st->is_boolean())
      throw bad_field("response_format.json_schema.strict",
                      "'response_format.json_schema.strict' must be a boolean");
    s.strict = st->get<bool>();
  }
  return s;
}

// vLLM's structured_outputs object, or the guided_* fields (prefix "guided_").
std::vector<GrammarSpec> vllm_fields(const Json& obj, const std::string& prefix,
                                     const std::string& key_prefix) {
  std::vector<GrammarSpec> out;
  auto get = [&](const char* k) -> const Json* {
    auto it = obj.find(key_prefix + k);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  };
  auto name = [&](const char* k) { return prefix + key_prefix + k; };
  if (const Json* v = get("json")) {
    GrammarSpec s;
    s.kind = GrammarSpec::Kind::kJsonSchema;
    s.field = name("json");
    s.schema = schema_field(*v, s.field);
    out.push_back(std::move(s));
  }
  if (const Json* v = get("regex")) {
    GrammarSpec s;
    s.kind = GrammarSpec::Kind::kRegex;
    s.field = name("regex");
    s.text = string_field(*v, s.field);
    out.push_back(std::move(s));
  }
  if (const Json* v = get("choice")) {
    GrammarSpec s;
    s.kind = GrammarSpec::Kind::kChoice;
    s.field = name("choice");
    s.choices = choice_field(*v, s.field);
    out.push_back(std::move(s));
  }
  if (const Json* v = get("grammar")) {
    GrammarSpec s;
    s.kind = GrammarSpec::Kind::kEbnf;
    s.field = name("grammar");
    s.text = string_field(*v, s.field);
    out.push_back(std::move(s));
  }
  if (const Json* v = get("json_object")) {
    if (!v->is_boolean())
      throw bad_field(name("json_object"), "'" + name("json_object") + "' must be a boolean");
    if (v->get<bool>()) {
      GrammarSpec s;
      s.kind = GrammarSpec::Kind::kJsonObject;
      s.field = name("json_object");
      out.push_back(std::move(s));
    }
  }
  return out;
}

std::shared_ptr<const grammar::Vocabulary> vocabulary(const ServedModel& m) {
  static std::mutex mu;
  static std::map<const text::Tokenizer*, std::shared_ptr<const grammar::Vocabulary>> by_tokenizer;
  std::lock_guard<std::mutex> lock(mu);
  auto& v = by_tokenizer[&m.tokenizer()];
  if (!v) v = grammar::Vocabulary::from_tokenizer(m.tokenizer(), static_cast<size_t>(m.config().vocab_size));
  return v;
}

grammar::GrammarCache& cache() {
  static grammar::GrammarCache c(64);
  return c;
}

// One XML parameter value: raw text for strings (the parser keeps it as is), JSON for everything else.
int32_t xml_value(grammar::Grammar& g, grammar::SchemaCompiler& c, const Json& schema) {
  const bool is_string = schema.is_object() && schema.contains("type") && schema["type"] == "string";
  if (!is_string) return c.value(schema);
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array() && !e->empty()) {
    std::vector<int32_t> alts;
    for (const auto& v : *e) alts.push_back(g.literal(v.is_string() ? v.get<std::string>() : v.dump()));
    return g.alt(std::move(alts));
  }
  if (auto p = schema.find("pattern"); p != schema.end() && p->is_string())
    return grammar::parse_regex(g, p->get<std::string>(), false);
  const int32_t max =
      schema.contains("maxLength") && schema["maxLength"].is_number_unsigned()
          ? static_cast<int32_t>(std::min<uint64_t>(schema["maxLength"].get<uint64_t>(), 4096))
          : 1024;
  // Text that cannot end the parameter early: no '<', and no line break.
  return g.repeat(g.char_class({{'\n', '\n'}, {'<', '<'}}, true), 1, std::max(max, 1));
}

int32_t tool_arguments(grammar::Grammar& g, const Json& tool_params, bool xml) {
  static const Json kAnyObject = {{"type", "object"}};
  const Json& schema = tool_params.is_object() ? tool_params : kAnyObject;
  grammar::SchemaCompiler c(g, schema, {});
  if (!xml) return c.value(schema);
  // <parameter=NAME>\nVALUE\n</parameter>\n for each property, required ones always, in the schema's order.
  std::vector<int32_t> items;
  std::vector<std::string> required;
  if (auto r = schema.find("required"); r != schema.end() && r->is_array())
    for (const auto& x : *r)
      if (x.is_string()) required.push_back(x.get<std::string>());
  if (auto props = schema.find("properties"); props != schema.end() && props->is_object()) {
    for (auto it = props->begin(); it != props->end(); ++it) {
      const int32_t p = g.seq({g.literal("<parameter=" + it.key() + ">\n"), xml_value(g, c, it.value()),
                               g.literal("\n</parameter>\n")});
      const bool req = std::find(required.begin(), required.end(), it.key()) != required.end();
      items.push_back(req ? p : g.optional(p));
    }
  }
  return g.seq(std::move(items));
}

}  // namespace

std::optional<GrammarSpec> parse_structured_output(const Json& body, Api api) {
  std::vector<GrammarSpec> found;
  if (api == Api::kOllama) {
    auto it = body.find("format");
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (it->is_string()) {
      const std::string f = it->get<std::string>();
      if (f.empty()) return std::nullopt;
      if (f != "json") throw bad_field("format", "'format' must be \"json\" or a JSON schema");
      GrammarSpec s;
      s.field = "format";
      return s;
    }
    GrammarSpec s;
    s.kind = GrammarSpec::Kind::kJsonSchema;
    s.field = "format";
    s.schema = schema_field(*it, "format");
    return s;
  }
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!(it->is_object() && it->contains("type") && (*it)["type"] == "text"))
      found.push_back(response_format(*it));
  }
  if (auto it = body.find("structured_outputs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_field("structured_outputs", "'structured_outputs' must be an object");
    for (auto& s : vllm_fields(*it, "structured_outputs.", "")) found.push_back(std::move(s));
  }
  for (auto& s : vllm_fields(body, "", "guided_")) found.push_back(std::move(s));
  if (found.empty()) return std::nullopt;
  if (found.size() > 1)
    throw bad_field(found[1].field, "'" + found[0].field + "' and '" + found[1].field +
                                        "' both ask for a structured output; give one");
  return std::move(found[0]);
}

GrammarSpec tool_call_spec(const Json& tools, const std::string& name, bool xml) {
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kToolCall;
  s.field = "tools";
  s.tools = tools;
  s.tool_name = name;
  s.xml = xml;
  return s;
}

grammar::Grammar build_grammar(const GrammarSpec& spec) {
  using K = GrammarSpec::Kind;
  switch (spec.kind) {
    case K::kJsonObject:
      return grammar::grammar_any_json_object();
    case K::kJsonSchema:
      return grammar::grammar_from_json_schema(spec.schema, {spec.strict});
    case K::kRegex:
      return grammar::grammar_from_regex(spec.text);
    case K::kChoice:
      return grammar::grammar_from_choices(spec.choices);
    case K::kEbnf:
      return grammar::parse_ebnf(spec.text);
    case K::kToolCall: {
      grammar::Grammar g;
      std::vector<int32_t> alts;
      for (const auto& t : spec.tools) {
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
        const Json& f = t["function"];
        const std::string name = f.value("name", "");
        if (name.empty() || (!spec.tool_name.empty() && name != spec.tool_name)) continue;
        const Json params = f.contains("parameters") ? f["parameters"] : Json(nullptr);
        const int32_t args = tool_arguments(g, params, spec.xml);
        // The prompt already holds the opening up to the name (and the name when it is named).
        const std::string head =
            spec.tool_name.empty() ? (spec.xml ? name + ">\n" : name + "\", \"arguments\": ") : std::string();
        const std::string tail = spec.xml ? "</function>\n</tool_call>" : "}\n</tool_call>";
        alts.push_back(g.seq({g.literal(head), args, g.literal(tail)}));
      }
      if (alts.empty()) throw grammar::GrammarError("no function in 'tools' to call");
      const int32_t root = g.new_rule("root");
      g.define(root, g.alt(std::move(alts)));
      g.set_root(root);
      return g;
    }
  }
  throw grammar::GrammarError("unknown structured output kind");
}

std::shared_ptr<grammar::CompiledGrammar> compile_spec(const GrammarSpec& spec, const ServedModel& m) {
  std::string key = std::to_string(static_cast<int>(spec.kind)) + (spec.strict ? "s" : "n") + "\n";
  switch (spec.kind) {
    case GrammarSpec::Kind::kJsonSchema:
      key += spec.schema.dump();
      break;
    case GrammarSpec::Kind::kChoice:
      key += Json(spec.choices).dump();
      break;
    case GrammarSpec::Kind::kToolCall:
      key += spec.tool_name + (spec.xml ? "\nxml\n" : "\njson\n") + spec.tools.dump();
      break;
    default:
      key += spec.text;
  }
  try {
    return cache().get(
        key, [&] { return build_grammar(spec); }, vocabulary(m));
  } catch (const grammar::GrammarError& e) {
    throw bad_field(spec.field, "'" + spec.field + "': " + e.what());
  } catch (const nlohmann::json::exception& e) {
    throw bad_field(spec.field, "'" + spec.field + "': " + e.what());
  }
}

void attach_constraint(std::vector<engine::GenerationRequest>& requests, const GrammarSpec& spec,
                       const ServedModel& m, bool in_reasoning) {
  auto compiled = compile_spec(spec, m);
  for (auto& r : requests) {
    GrammarConstraint::Options o;
    o.stop_ids = r.stop_ids;
    o.in_reasoning = in_reasoning;
    o.think_end_id = m.think_end_id();
    o.vocab = static_cast<size_t>(m.config().vocab_size);
    r.constraint = std::make_shared<GrammarConstraint>(compiled, std::move(o));
  }
}

}  // namespace deltaflow::server
