"""Ollama API through the official `ollama` client: chat and generate (NDJSON streaming, the default),
thinking, tools, options, tags/show/ps/version, errors."""
import json

import httpx
import ollama
import pytest

from conftest import MODEL


@pytest.fixture(scope="module")
def oc(server):
    return ollama.Client(host=server.url, headers=server.headers(), timeout=60)


def test_tags_show_ps_version(oc, server):
    tags = oc.list()
    assert [m.model for m in tags.models] == [MODEL]
    assert tags.models[0].size > 0 and tags.models[0].details.format == "safetensors"
    show = oc.show(MODEL)
    assert "tools" in show.capabilities and "thinking" in show.capabilities
    assert show.modelinfo["general.architecture"] == "qwen35"
    assert "<|im_start|>" in show.template
    ps = oc.ps()
    assert ps.models[0].model == MODEL and ps.models[0].context_length == 4096
    v = httpx.get(server.url + "/api/version", headers=server.headers()).json()
    assert isinstance(v["version"], str)


def test_chat_stream_and_not(oc):
    msgs = [{"role": "user", "content": "Hello"}]
    opts = {"temperature": 0, "num_predict": 10}
    whole = oc.chat(model=MODEL, messages=msgs, options=opts, think=False)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant"
    assert whole.eval_count >= 1 and whole.prompt_eval_count > 0
    parts = list(oc.chat(model=MODEL, messages=msgs, options=opts, think=False, stream=True))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count


def test_generate_and_options(oc):
    a = oc.generate(model=MODEL, prompt="Once", options={"temperature": 1.0, "seed": 7, "num_predict": 12})
    b = oc.generate(model=MODEL, prompt="Once", options={"temperature": 1.0, "seed": 7, "num_predict": 12})
    assert a.response == b.response and a.thinking == b.thinking
    assert a.eval_count <= 12
    raw = list(oc.generate(model=MODEL, prompt="Once upon", raw=True, stream=True,
                           options={"temperature": 0, "num_predict": 6}))
    assert raw[-1].done and raw[-1].eval_count <= 6
    empty = oc.generate(model=MODEL, prompt="")
    assert empty.done


def post_raw(server, path, body):
    """The test hook is a request field the ollama client cannot send: post it with httpx, then read the
    reply with the client's own response types."""
    r = httpx.post(server.url + path, json=body, headers=server.headers(), timeout=60)
    assert r.status_code == 200, r.text
    if body.get("stream") is False:
        return r.json()
    return [json.loads(line) for line in r.text.splitlines() if line]


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]
CALL = ("Need weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>")


def test_thinking(server):
    forced = "Let me see.\n</think>\n\nHi!<|im_end|>"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hey"}], "think": True,
            "deltaflow_forced_tokens": forced, "options": {"num_predict": 50}}
    r = ollama.ChatResponse(**post_raw(server, "/api/chat", dict(body, stream=False)))
    assert r.message.thinking == "Let me see." and r.message.content == "Hi!" and r.done_reason == "stop"
    parts = [ollama.ChatResponse(**p) for p in post_raw(server, "/api/chat", body)]
    assert "".join(p.message.thinking or "" for p in parts) == "Let me see."
    assert "".join(p.message.content for p in parts) == "Hi!"
    g = ollama.GenerateResponse(**post_raw(server, "/api/generate", {
        "model": MODEL, "prompt": "hey", "stream": False, "deltaflow_forced_tokens": forced}))
    assert g.thinking == "Let me see." and g.response == "Hi!"


def test_tool_calls(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
            "deltaflow_forced_tokens": CALL, "options": {"num_predict": 300}}
    r = ollama.ChatResponse(**post_raw(server, "/api/chat", dict(body, stream=False)))
    (call,) = r.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris", "days": 2}
    assert r.message.thinking == "Need weather." and r.message.content == ""
    parts = [ollama.ChatResponse(**p) for p in post_raw(server, "/api/chat", body)]
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris",
                                                                                              "days": 2})]
    assert all("<tool_call>" not in p.message.content for p in parts)
    # The next turn: the call and its result render through the chat template and the model answers.
    oc = ollama.Client(host=server.url, headers=server.headers(), timeout=60)
    messages = body["messages"] + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    r = oc.chat(model=MODEL, messages=messages, tools=TOOLS, options={"num_predict": 5, "temperature": 0})
    assert r.done and r.prompt_eval_count > 0


def test_errors(oc):
    with pytest.raises(ollama.ResponseError) as e:
        oc.chat(model="llama3", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        oc.chat(model=MODEL, messages=[{"role": "user", "content": "x"}], options={"temperature": "hot"})
    assert e.value.status_code == 400 and "temperature" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:
        oc.chat(model=MODEL, messages=[{"role": "user", "content": "x"}], format={"type": "wizard"})
    assert e.value.status_code == 400
