// JSON schema -> grammar of the JSON texts the schema accepts (the approach of xgrammar's
// json_schema_converter and llama.cpp's json-schema-to-grammar, written for our Grammar).
//
// Supported: type (one or a list), properties / required / additionalProperties (absent means none: object
// keys come in the schema's order, required ones always, optional ones may be left out), nested objects,
// items / prefixItems / minItems / maxItems, enum, const, anyOf / oneOf (as alternatives), allOf (merged),
// $ref into $defs / definitions (recursion allowed), string minLength / maxLength / pattern / format (date,
// time, date-time, uuid, email, ipv4, hostname, uri), integer and number minimum / maximum /
// exclusiveMinimum / exclusiveMaximum, nullable. Numbers have at most 16 integer and 15 fraction digits and
// whitespace runs at most kMaxWhitespace characters, so generation cannot run away inside one.
//
// strict: keywords the grammar cannot enforce (not, if, multipleOf, uniqueItems, patternProperties, an
// unknown format, ...) are an error; otherwise they are ignored (the output still has the shape the rest of
// the schema asks for).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "grammar/grammar.hpp"

namespace deltaflow::grammar {

using Json = nlohmann::ordered_json;

constexpr int kMaxWhitespace = 16;

struct SchemaOptions {
  bool strict = false;
};

// Adds the expressions of schemas to a grammar (several schemas may share one grammar: tool calls).
class SchemaCompiler {
 public:
  SchemaCompiler(Grammar& g, const Json& root, SchemaOptions o);
  // The JSON values valid under `schema` (a part of `root`, or `root` itself). Throws GrammarError.
  int32_t value(const Json& schema, int depth = 0);
  // Any JSON value; any JSON object.
  int32_t any_value();
  int32_t any_object();
  int32_t ws() const { return ws_; }

 private:
  int32_t object(const Json& s, int depth);
  int32_t array(const Json& s, int depth);
  int32_t string(const Json& s);
  int32_t integer(const Json& s);
  int32_t number(const Json& s);
  int32_t ref(const std::string& ref, int depth);
  int32_t typed(const Json& s, const std::string& type, int depth);
  Json merged_all_of(const Json& s, int depth);
  void check_keywords(const Json& s) const;
  int32_t quoted(int32_t content);
  int32_t sep();

  Grammar& g_;
  const Json& root_;
  SchemaOptions o_;
  int32_t ws_ = -1;
  int32_t any_value_rule_ = -1, any_object_rule_ = -1;
  std::map<std::string, int32_t> refs_;
};

// A grammar whose root is the schema's values.
Grammar grammar_from_json_schema(const Json& schema, SchemaOptions o = {});
// A grammar of any JSON object (response_format json_object, Ollama format "json").
Grammar grammar_any_json_object();

}  // namespace deltaflow::grammar
