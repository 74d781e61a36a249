// Structured outputs: the request fields that ask for a grammar, parsed into a GrammarSpec, compiled (with a
// cache) for the served model's vocabulary, and attached to the engine requests as constraints.
//
//   OpenAI   response_format {"type": "json_object"} | {"type": "json_schema", "json_schema": {"schema",
//            "strict"}} ("text": none)
//   vLLM     structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object"}, and the older
//            guided_json, guided_regex, guided_choice, guided_grammar
//   Ollama   format: "json" or a JSON schema
//   tools    tool_choice "required" or a named function: the call's name is one of `tools` and its
//            arguments follow that tool's parameters schema (see tool_call_spec)
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.hpp"
#include "grammar/compile.hpp"
#include "server/request_params.hpp"
#include "server/served_model.hpp"

namespace deltaflow::server {

struct GrammarSpec {
  enum class Kind { kJsonObject, kJsonSchema, kRegex, kChoice, kEbnf, kToolCall };
  Kind kind = Kind::kJsonObject;
  Json schema;                       // kJsonSchema
  std::string text;                  // kRegex, kEbnf
  std::vector<std::string> choices;  // kChoice
  bool strict = false;
  std::string field;  // the request field it came from (for errors)
  // kToolCall: the tools, the named one (empty: any), the call format.
  Json tools;
  std::string tool_name;
  bool xml = false;
};

// The spec a body asks for, or none. Throws ApiError (400 naming the field) on a malformed field, or when
// more than one field asks for a grammar.
std::optional<GrammarSpec> parse_structured_output(const Json& body, Api api);

// The grammar that continues a tool call the prompt opened (openai_routes' tool_prefix:
// `<tool_call>\n{"name":
// "` or `<tool_call>\n<function=`, plus the name when one is named) to its end.
GrammarSpec tool_call_spec(const Json& tools, const std::string& name, bool xml);

grammar::Grammar build_grammar(const GrammarSpec& spec);

// Compiles (cached by the spec's text) for the model's vocabulary. Throws ApiError 400 naming spec.field
// when the schema or grammar is invalid or too large.
std::shared_ptr<grammar::CompiledGrammar> compile_spec(const GrammarSpec& spec, const ServedModel& m);

// Gives every request its own matcher over the compiled grammar. in_reasoning: the prompt ends inside
// <think>, so the grammar starts after </think>.
void attach_constraint(std::vector<engine::GenerationRequest>& requests, const GrammarSpec& spec,
                       const ServedModel& m, bool in_reasoning);

}  // namespace deltaflow::server
