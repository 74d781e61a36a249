"""Structured outputs against the default model (models/house, small and nearly random, so every output is
the grammar's doing): OpenAI response_format (json_object, json_schema with strict), Ollama format, vLLM's
structured_outputs / guided_* extras, tool_choice required / named, streaming, reasoning, and clear 400s.
Every output must parse and validate against its schema (checked by `validate` below: jsonschema is not in
the test requirements)."""
import datetime
import ipaddress
import json
import os
import re
import uuid

import ollama
import pytest

from conftest import MODEL, Server

HOUSE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "house")
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
ASK = [{"role": "user", "content": "Answer in JSON."}]


@pytest.fixture(scope="module")
def house():
    s = Server(HOUSE, "--quiet")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def oai(house):
    return house.openai(timeout=120)


@pytest.fixture(scope="module")
def oll(house):
    return ollama.Client(host=house.url, headers=house.headers(), timeout=120)


# --- a small JSON-schema checker (the keywords the schemas below use) ---------------------------------------

def _format_ok(fmt, s):
    try:
        if fmt == "date":
            datetime.date.fromisoformat(s)
            return re.fullmatch(r"\d{4}-\d{2}-\d{2}", s) is not None
        if fmt == "date-time":
            datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
            return "T" in s
        if fmt == "uuid":
            uuid.UUID(s)
            return len(s) == 36
        if fmt == "email":
            return re.fullmatch(r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}", s) is not None
        if fmt == "ipv4":
            ipaddress.IPv4Address(s)
            return True
    except ValueError:
        return False
    return True


def validate(v, s, root=None, path="$"):
    root = s if root is None else root
    if s is True:
        return
    if "$ref" in s:
        target = root
        for part in s["$ref"].lstrip("#/").split("/"):
            if part:
                target = target[part]
        return validate(v, target, root, path)
    if "allOf" in s:  # merged, as the grammar does (properties and required united)
        merged = {k: x for k, x in s.items() if k != "allOf"}
        for sub in s["allOf"]:
            for k, x in sub.items():
                if k == "properties":
                    merged["properties"] = dict(merged.get("properties", {}), **x)
                elif k == "required":
                    merged["required"] = merged.get("required", []) + x
                else:
                    merged.setdefault(k, x)
        return validate(v, merged, root, path)
    if "anyOf" in s or "oneOf" in s:
        subs = s.get("anyOf") or s.get("oneOf")
        ok = 0
        for sub in subs:
            try:
                validate(v, sub, root, path)
                ok += 1
            except AssertionError:
                pass
        assert ok >= 1 if "anyOf" in s else ok == 1, "%s: %r matches %d of %s" % (path, v, ok, subs)
    if "const" in s:
        assert v == s["const"], path
    if "enum" in s:
        assert v in s["enum"], "%s: %r not in %r" % (path, v, s["enum"])
    types = s.get("type")
    if types is not None:
        types = types if isinstance(types, list) else [types]
        kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
        good = any((isinstance(v, int) and not isinstance(v, bool)) if t == "integer" else
                   (isinstance(v, (int, float)) and not isinstance(v, bool)) if t == "number" else
                   isinstance(v, kinds[t]) for t in types)
        assert good, "%s: %r is not %s" % (path, v, types)
    if isinstance(v, dict):
        props = s.get("properties", {})
        for r in s.get("required", []):
            assert r in v, "%s: missing %r" % (path, r)
        extra = s.get("additionalProperties", True if "properties" not in s else False)
        for k, x in v.items():
            if k in props:
                validate(x, props[k], root, path + "." + k)
            else:
                assert extra is not False, "%s: extra property %r" % (path, k)
                if isinstance(extra, dict):
                    validate(x, extra, root, path + "." + k)
    if isinstance(v, list):
        assert len(v) >= s.get("minItems", 0), path
        assert len(v) <= s.get("maxItems", 10 ** 9), path
        if isinstance(s.get("items"), dict):
            for i, x in enumerate(v):
                validate(x, s["items"], root, "%s[%d]" % (path, i))
    if isinstance(v, str):
        assert len(v) >= s.get("minLength", 0), path
        assert len(v) <= s.get("maxLength", 10 ** 9), path
        if "pattern" in s:
            assert re.search(s["pattern"], v), "%s: %r !~ %s" % (path, v, s["pattern"])
        if "format" in s:
            assert _format_ok(s["format"], v), "%s: %r is not a %s" % (path, v, s["format"])
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if "minimum" in s:
            assert v >= s["minimum"], path
        if "maximum" in s:
            assert v <= s["maximum"], path
        if "exclusiveMinimum" in s:
            assert v > s["exclusiveMinimum"], path
        if "exclusiveMaximum" in s:
            assert v < s["exclusiveMaximum"], path


def test_the_checker_rejects():
    # The checker must be able to fail, or the schema tests below prove nothing.
    s = {"type": "object", "properties": {"a": {"type": "integer", "maximum": 3}}, "required": ["a"]}
    for bad in ({}, {"a": 4}, {"a": "x"}, {"a": 1, "b": 2}):
        with pytest.raises(AssertionError):
            validate(bad, s)
    with pytest.raises(AssertionError):
        validate("2024-02-30", {"type": "string", "format": "date"})
    validate({"a": 3}, s)


S = lambda **kw: dict(kw)  # noqa: E731
NAME = {"type": "string", "maxLength": 12}
SCHEMAS = [
    S(type="object", properties={"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
      required=["name", "age"]),
    S(type="object", properties={"user": S(type="object", properties={
        "name": NAME, "address": S(type="object", properties={
            "street": {"type": "string", "maxLength": 16}, "zip": {"type": "string", "pattern": r"^\d{5}$"}},
            required=["street", "zip"])}, required=["name", "address"])}, required=["user"]),
    S(type="array", items={"type": "integer", "minimum": -50, "maximum": 50}, minItems=1, maxItems=4),
    S(type="string", enum=["red", "green", "blue"]),
    S(type="object", properties={"kind": {"const": "event"}, "color": {"enum": ["red", "green", 7, None]}},
      required=["kind", "color"]),
    S(type="object", properties={"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                     {"type": "string", "maxLength": 5}, {"type": "null"}]}},
      required=["value"]),
    S(type="object", properties={"day": {"type": "string", "format": "date"}}, required=["day"]),
    S(type="object", properties={"ts": {"type": "string", "format": "date-time"}}, required=["ts"]),
    S(type="object", properties={"id": {"type": "string", "format": "uuid"}}, required=["id"]),
    S(type="object", properties={"email": {"type": "string", "format": "email"}}, required=["email"]),
    S(type="number", minimum=-1.5, maximum=2.5),
    S(type="integer", exclusiveMinimum=0, exclusiveMaximum=10),
    S(type="object", properties={"a": {"type": "boolean"}, "b": {"type": "integer", "minimum": 1, "maximum": 5},
                                 "c": NAME}, additionalProperties=False),
    S(type="array", items=S(type="object", properties={"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                       "y": {"type": "boolean"}}, required=["x", "y"]), maxItems=3),
    S(type="array", items=S(type="array", items={"enum": ["a", "b"]}, maxItems=2), minItems=1, maxItems=2),
    S(oneOf=[{"type": "integer", "minimum": 0, "maximum": 100}, {"type": "boolean"}]),
    S(type="object", properties={"p": {"$ref": "#/$defs/pt"}, "q": {"$ref": "#/$defs/pt"}}, required=["p", "q"],
      **{"$defs": {"pt": S(type="object", properties={"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                                      "y": {"type": "integer", "minimum": -9, "maximum": 9}},
                           required=["x", "y"])}}),
    S(type="object", properties={"code": {"type": "string", "pattern": r"^[A-Z]{3}-\d{2}$"}}, required=["code"]),
    S(type="object", properties={"flag": {"type": "boolean"}, "nothing": {"type": "null"}},
      required=["flag", "nothing"]),
    S(type=["string", "integer"], maxLength=4, minimum=0, maximum=99),
    S(allOf=[S(type="object", properties={"a": {"type": "integer", "minimum": 0, "maximum": 3}}),
             S(properties={"b": {"type": "boolean"}}, required=["b"])]),
    S(type="object", properties={"s": {"type": "string", "minLength": 3, "maxLength": 5},
                                 "ip": {"type": "string", "format": "ipv4"}}, required=["s", "ip"]),
    S(type="object", properties={"t": {"type": "number", "minimum": 0, "maximum": 1},
                                 "n": {"type": "integer", "minimum": -1000, "maximum": -10}}, required=["t", "n"]),
    S(type="object", properties={"tags": S(type="array", items={"type": "string", "maxLength": 6}, maxItems=3),
                                 "meta": S(type="object", properties={"v": {"type": "integer", "minimum": 1,
                                                                            "maximum": 3}}, required=["v"])},
      required=["tags", "meta"]),
]


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_openai_json_schema_outputs_validate(oai, i):
    schema = SCHEMAS[i]
    strict = i % 2 == 0
    r = oai.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=1500, temperature=1.0, seed=i, extra_body=NO_THINK,
        response_format={"type": "json_schema", "json_schema": {"name": "s%d" % i, "schema": schema,
                                                                "strict": strict}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    validate(json.loads(c.message.content), schema)


@pytest.mark.parametrize("i", range(0, len(SCHEMAS), 3))
def test_ollama_format_schema_outputs_validate(oll, i):
    schema = SCHEMAS[i]
    r = oll.chat(model=MODEL, messages=ASK, format=schema, think=False,
                 options={"num_predict": 1500, "seed": 100 + i, "temperature": 1.0})
    assert r.done_reason == "stop", r
    validate(json.loads(r.message.content), schema)


def test_json_object_openai_and_ollama(oai, oll):
    for seed in range(3):
        r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2000, seed=seed, temperature=0.7,
                                        response_format={"type": "json_object"}, extra_body=NO_THINK)
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
        else:  # the one unbounded grammar: a cut-off output is still a prefix of an object
            assert r.choices[0].message.content.lstrip().startswith("{")
    g = oll.generate(model=MODEL, prompt="JSON please", format="json", think=False,
                     options={"num_predict": 2000, "seed": 5, "temperature": 0.7})
    if g.done_reason == "stop":
        assert isinstance(json.loads(g.response), dict)
    else:
        assert g.response.lstrip().startswith("{")


def test_vllm_extras(oai):
    def ask(**extra):
        r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=200, seed=3, temperature=1.0,
                                        extra_body=dict(NO_THINK, **extra))
        assert r.choices[0].finish_reason == "stop", r
        return r.choices[0].message.content
    assert re.fullmatch(r"[a-z]{2,5}-\d{3}", ask(guided_regex=r"[a-z]{2,5}-\d{3}"))
    assert ask(guided_choice=["alpha", "beta", "gamma"]) in ("alpha", "beta", "gamma")
    assert re.fullmatch(r"(yes|no)+!", ask(guided_grammar='root ::= ("yes" | "no")+ "!"' if False else
                                           'root ::= ans "!"\nans ::= ("yes" | "no") ("yes" | "no")?'))
    validate(json.loads(ask(guided_json=SCHEMAS[0])), SCHEMAS[0])
    validate(json.loads(ask(guided_json=json.dumps(SCHEMAS[4]))), SCHEMAS[4])
    assert ask(structured_outputs={"choice": ["left", "right"]}) in ("left", "right")
    assert re.fullmatch(r"\d{4}", ask(structured_outputs={"regex": r"\d{4}"}))


def test_completions_and_streaming(oai):
    r = oai.completions.create(model=MODEL, prompt="x =", max_tokens=400, seed=1, temperature=1.0,
                               extra_body={"guided_json": SCHEMAS[1]})
    assert r.choices[0].finish_reason == "stop"
    validate(json.loads(r.choices[0].text), SCHEMAS[1])
    chunks = oai.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=1500, seed=2, temperature=1.0, stream=True, extra_body=NO_THINK,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMAS[13]}})
    text, finish = "", None
    for ch in chunks:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    assert finish == "stop"
    validate(json.loads(text), SCHEMAS[13])


def test_n_choices_each_validate(oai):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=800, n=3, seed=9, temperature=1.0,
                                    extra_body=NO_THINK,
                                    response_format={"type": "json_schema", "json_schema": {"name": "x",
                                                                                            "schema": SCHEMAS[5]}})
    assert len(r.choices) == 3
    for c in r.choices:
        assert c.finish_reason == "stop"
        validate(json.loads(c.message.content), SCHEMAS[5])


def test_reasoning_then_json(oai):
    # Thinking on; a small budget closes the thought, then the grammar applies to the answer only.
    r = oai.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=800, seed=4, temperature=1.0,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}, "thinking_token_budget": 8},
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMAS[0]}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    assert c.message.reasoning_content
    validate(json.loads(c.message.content), SCHEMAS[0])


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": S(
        type="object", properties={"city": {"type": "string", "maxLength": 12},
                                   "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                   "unit": {"type": "string", "enum": ["C", "F"]}},
        required=["city", "days"])}},
    {"type": "function", "function": {"name": "add", "parameters": S(
        type="object", properties={"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                   "b": {"type": "integer", "minimum": 0, "maximum": 99}}, required=["a", "b"])}},
]


@pytest.mark.parametrize("seed", range(4))
def test_tool_choice_required_and_named(oai, seed):
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
                                    tool_choice="required", max_tokens=600, seed=seed, temperature=1.0)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name in by_name
    validate(json.loads(call.function.arguments), by_name[call.function.name])
    assert r.choices[0].finish_reason == "tool_calls"
    r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "add"}], tools=TOOLS,
                                    tool_choice={"type": "function", "function": {"name": "add"}},
                                    max_tokens=600, seed=seed, temperature=1.0)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "add"
    validate(json.loads(call.function.arguments), by_name["add"])


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wizard"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
        "type": "string", "not": {"const": "a"}}}}}, "response_format.json_schema.schema"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": "root ::= missing_rule"}, "guided_grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"structured_outputs": {"json": {"$ref": "#/nowhere"}}}, "structured_outputs.json"),
])
def test_bad_structured_output_is_400(house, extra, param):
    body = dict({"model": MODEL, "messages": ASK, "max_tokens": 4}, **extra)
    r = house.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == param and e["type"] == "invalid_request_error", e
    assert e["message"]


def test_ollama_bad_format_is_400(house):
    for fmt in ("yaml", 5, {"type": "wizard"}):
        r = house.post("/api/chat", {"model": MODEL, "messages": ASK, "format": fmt, "stream": False})
        assert r.status_code == 400, r.text
        assert "format" in r.json()["error"]
