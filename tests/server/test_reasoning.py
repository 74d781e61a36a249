"""Reasoning: <think>...</think> goes to reasoning_content (streamed as reasoning deltas), enable_thinking
through chat_template_kwargs, top level, or the server default, and the thinking_token_budget."""
from conftest import MODEL

HELLO = [{"role": "user", "content": "What is 2 + 2?"}]


def chat(client, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", HELLO)
    return client.chat.completions.create(**kw)


def reasoning(msg):
    return msg.model_extra.get("reasoning_content")


def test_reasoning_split(client):
    forced = "The user asks a sum.\nIt is 4.\n</think>\n\nThe answer is 4.<|im_end|>"
    r = chat(client, max_tokens=100, extra_body={"deltaflow_forced_tokens": forced})
    m = r.choices[0].message
    assert reasoning(m) == "The user asks a sum.\nIt is 4."
    assert m.content == "The answer is 4."
    assert r.choices[0].finish_reason == "stop"


def test_reasoning_split_streamed(client):
    forced = "Think step one.\n</think>\n\nDone here.<|im_end|>"
    chunks = list(chat(client, max_tokens=100, stream=True, extra_body={"deltaflow_forced_tokens": forced}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    r = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    c = "".join(d.content or "" for d in deltas)
    assert r == "Think step one."
    assert c == "Done here."
    # Reasoning arrives in several deltas, before any content, and no delta holds a tag.
    kinds = [("r" if d.model_extra.get("reasoning_content") else "") + ("c" if d.content else "") for d in deltas]
    kinds = [k for k in kinds if k]
    assert kinds.count("r") >= 2 and "rc" not in kinds
    assert kinds.index("c") > max(i for i, k in enumerate(kinds) if k == "r")
    for d in deltas:
        assert "think>" not in (d.content or "") + (d.model_extra.get("reasoning_content") or "")


def test_enable_thinking_switches(client, server):
    on = server.post("/tokenize", {"messages": HELLO}).json()["tokens"]
    off = server.post("/tokenize", {"messages": HELLO, "chat_template_kwargs": {"enable_thinking": False}}).json()
    off_text = server.post("/detokenize", {"tokens": off["tokens"]}).json()["prompt"]
    on_text = server.post("/detokenize", {"tokens": on}).json()["prompt"]
    assert on_text.endswith("<|im_start|>assistant\n<think>\n")
    assert off_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    forced = "Plain answer.<|im_end|>"
    for kw in ({"chat_template_kwargs": {"enable_thinking": False}}, {"enable_thinking": False}):
        r = chat(client, max_tokens=50, extra_body=dict(kw, deltaflow_forced_tokens=forced))
        assert r.choices[0].message.content == "Plain answer."
        assert reasoning(r.choices[0].message) is None
        assert r.usage.prompt_tokens == off["count"]
    # With thinking on (the default), the same text is an unfinished thought.
    r = chat(client, max_tokens=50, extra_body={"deltaflow_forced_tokens": forced})
    assert reasoning(r.choices[0].message) == "Plain answer."
    assert r.choices[0].message.content == ""


def test_server_default_thinking_off(start_server):
    s = start_server("--default-enable-thinking", "false", "--enable-test-hooks")
    r = chat(s.openai(), max_tokens=20, extra_body={"deltaflow_forced_tokens": "Hi.<|im_end|>"})
    assert r.choices[0].message.content == "Hi."
    r = chat(s.openai(), max_tokens=20, extra_body={"deltaflow_forced_tokens": "Hmm.\n</think>\n\nHi.<|im_end|>",
                                                    "chat_template_kwargs": {"enable_thinking": True}})
    assert reasoning(r.choices[0].message) == "Hmm."
    assert r.choices[0].message.content == "Hi."


def test_thinking_token_budget(client, server):
    budget = 6
    r = chat(client, max_tokens=40, temperature=0, logprobs=True,
             extra_body={"thinking_token_budget": budget, "ignore_eos": True})
    m = r.choices[0].message
    tokens = [e.token for e in r.choices[0].logprobs.content]
    # After `budget` thought tokens the engine forced "\n</think>\n\n", and the answer went on after it.
    newline = server.post("/tokenize", {"prompt": "\n"}).json()["count"]
    assert tokens.index("</think>") == budget + newline
    assert r.usage.completion_tokens == 40
    assert m.content, "the answer after the forced </think> is missing"
    unbounded = chat(client, max_tokens=40, temperature=0, extra_body={"ignore_eos": True}).choices[0].message
    assert reasoning(unbounded) and len(reasoning(unbounded)) > len(reasoning(m) or "")
    assert unbounded.content == ""
    # Streamed: the same split.
    chunks = list(chat(client, max_tokens=40, temperature=0, stream=True,
                       extra_body={"thinking_token_budget": budget, "ignore_eos": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == m.content
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == (reasoning(m) or "")
    # Budget 0: the thought closes at once.
    r = chat(client, max_tokens=10, temperature=0, logprobs=True,
             extra_body={"thinking_token_budget": 0, "ignore_eos": True})
    assert [e.token for e in r.choices[0].logprobs.content].index("</think>") == newline
    assert not reasoning(r.choices[0].message)
