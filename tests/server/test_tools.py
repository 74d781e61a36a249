"""Tool calling end to end. A random tiny model never calls tools, so the replies are forced through the test
hook (--enable-test-hooks, "deltaflow_forced_tokens"): the engine emits those tokens as if sampled, and
everything after it (detokenizer, reasoning split, tool-call parser, streaming deltas) runs as usual."""
import json

import pytest

from conftest import MODEL

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
            "options": {"type": "object"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": ["integer", "null"]}}}}},
]
ASK = [{"role": "user", "content": "Weather in Paris and Oslo?"}]

XML_TWO_CALLS = (
    "The user wants two cities.\n</think>\n\n"
    "I will check both.\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "<parameter=metric>\ntrue\n</parameter>\n<parameter=options>\n{\"lang\": \"fr\"}\n</parameter>\n</function>\n"
    "</tool_call>\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call><|im_end|>")


def chat(client, forced, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", ASK)
    kw.setdefault("tools", TOOLS)
    kw.setdefault("max_tokens", 400)
    extra = kw.pop("extra_body", {})
    extra["deltaflow_forced_tokens"] = forced
    return client.chat.completions.create(extra_body=extra, **kw)


def test_xml_calls_typed_by_schema(client):
    r = chat(client, XML_TWO_CALLS)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content == "I will check both."
    assert c.message.model_extra["reasoning_content"] == "The user wants two cities."
    calls = c.message.tool_calls
    assert [t.function.name for t in calls] == ["get_weather", "get_weather"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "days": 3, "metric": True,
                                                       "options": {"lang": "fr"}}
    assert json.loads(calls[1].function.arguments) == {"city": "Oslo"}
    assert all(t.type == "function" and t.id.startswith("call_") for t in calls)
    assert calls[0].id != calls[1].id


def test_xml_calls_streamed(client):
    chunks = list(chat(client, XML_TWO_CALLS, stream=True))
    content = ""
    calls = {}
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        assert "<tool_call" not in (d.content or "") and "<function" not in (d.content or "")
        content += d.content or ""
        for t in d.tool_calls or []:
            if t.id:
                assert t.index not in calls
                calls[t.index] = {"id": t.id, "name": t.function.name, "args": ""}
            calls[t.index]["args"] += t.function.arguments or ""
    assert content == "I will check both."
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "get_weather"]
    assert json.loads(calls[0]["args"]) == {"city": "Paris", "days": 3, "metric": True, "options": {"lang": "fr"}}
    assert json.loads(calls[1]["args"]) == {"city": "Oslo"}
    # Arguments arrive per parameter, before the call ends.
    arg_deltas = [t for ch in chunks if ch.choices for t in (ch.choices[0].delta.tool_calls or [])
                  if t.index == 0 and t.function.arguments]
    assert len(arg_deltas) >= 4
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["tool_calls"]


def test_qwen3_json_calls(client):
    forced = ("\n</think>\n\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"sushi\", \"limit\": 5}}\n"
              "</tool_call><|im_end|>")
    r = chat(client, forced)
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "search"
    assert json.loads(call.function.arguments) == {"query": "sushi", "limit": 5}
    assert not r.choices[0].message.content


def test_call_inside_thought_is_not_lost(client):
    forced = ("Need weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n"
              "</tool_call><|im_end|>")
    r = chat(client, forced)
    assert r.choices[0].message.model_extra["reasoning_content"] == "Need weather."
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Rome"}


def test_tool_choice_none_leaves_text(client):
    forced = "\n</think>\n\n<tool_call>\n<function=get_weather>\n</function>\n</tool_call><|im_end|>"
    r = chat(client, forced, tool_choice="none")
    assert not r.choices[0].message.tool_calls
    assert "<tool_call>" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"


def test_tool_choice_named_and_required(client, server):
    # Named: the prompt already opens the call; the model only writes the parameters.
    r = chat(client, "<parameter=query>\ncats\n</parameter>\n</function>\n</tool_call><|im_end|>",
             tool_choice={"type": "function", "function": {"name": "search"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "search" and json.loads(call.function.arguments) == {"query": "cats"}
    assert r.choices[0].finish_reason == "tool_calls"
    # Required: the prompt opens "<function=", the model names it.
    r = chat(client, "get_weather>\n<parameter=city>\nLima\n</parameter>\n</function>\n</tool_call><|im_end|>",
             tool_choice="required")
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Lima"}
    # Streamed named call: the name comes first, before any model token.
    chunks = list(chat(client, "<parameter=query>\ndogs\n</parameter>\n</function>\n</tool_call><|im_end|>",
                       tool_choice={"type": "function", "function": {"name": "search"}}, stream=True))
    names = [t.function.name for ch in chunks if ch.choices for t in (ch.choices[0].delta.tool_calls or []) if t.id]
    assert names == ["search"]


def test_tool_results_next_turn(client, server):
    first = chat(client, XML_TWO_CALLS)
    calls = first.choices[0].message.tool_calls
    messages = ASK + [
        {"role": "assistant", "content": first.choices[0].message.content,
         "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "Paris: sunny, 21C"},
        {"role": "tool", "tool_call_id": calls[1].id, "content": "Oslo: rain, 9C"},
    ]
    r = chat(client, "\n</think>\n\nParis is sunny; Oslo is rainy.<|im_end|>", messages=messages)
    assert r.choices[0].message.content == "Paris is sunny; Oslo is rainy."
    assert r.choices[0].finish_reason == "stop"
    rendered = server.post("/detokenize", {"tokens": server.post("/tokenize", {"messages": messages, "tools": TOOLS})
                                           .json()["tokens"]}).json()["prompt"]
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in rendered
    assert "<tool_response>\nParis: sunny, 21C\n</tool_response>" in rendered
    assert "<tool_response>\nOslo: rain, 9C\n</tool_response>" in rendered


@pytest.mark.parametrize("tools,tool_choice,field", [
    ([{"type": "function", "function": {"description": "no name"}}], None, "tools[0].function.name"),
    ([{"type": "retrieval"}], None, "tools[0].type"),
    ("not a list", None, "tools"),
    (TOOLS, "sometimes", "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": "missing"}}, "tool_choice"),
    (None, "required", "tool_choice"),
])
def test_bad_tools_are_400(server, tools, tool_choice, field):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 5}
    if tools is not None:
        body["tools"] = tools
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
