"""OpenAI API through the official `openai` client: chat and completions, streamed and not, usage, logprobs,
n, seeds, stop strings and ids, max_tokens, ignore_eos, generation_config defaults, /v1/models,
/tokenize and /detokenize."""
import json
import os

import httpx

from conftest import MODEL

HELLO = [{"role": "user", "content": "Hello there"}]


def chat(client, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", HELLO)
    return client.chat.completions.create(**kw)


def test_models(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].model_extra["max_model_len"] == 4096
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_non_streaming_usage(client, server):
    r = chat(client, max_tokens=12, temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.object == "chat.completion"
    assert r.model == MODEL
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length")
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    prompt = server.post("/tokenize", {"messages": HELLO, "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert r.usage.prompt_tokens == prompt["count"]
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_streaming_matches_non_streaming(client):
    kw = dict(max_tokens=16, temperature=0, extra_body={"ignore_eos": True, "enable_thinking": False})
    whole = chat(client, **kw)
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    # One chunk per token: 16 tokens cannot come in fewer than a handful of content chunks.
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) >= 8


def test_sse_wire_format(server):
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 4, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=server.headers(),
                                    timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [l for l in r.iter_lines() if l]
    assert lines[-1] == "data: [DONE]"
    for l in lines[:-1]:
        assert l.startswith("data: ") or l.startswith(":")
        if l.startswith("data: "):
            json.loads(l[6:])


def test_completions_prompt_forms(client):
    base = dict(model=MODEL, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    one = client.completions.create(prompt="Once upon a time", **base)
    assert one.object == "text_completion" and len(one.choices) == 1
    assert one.choices[0].finish_reason == "length" and one.usage.completion_tokens == 6
    two = client.completions.create(prompt=["Once upon a time", "The end"], **base)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].text == one.choices[0].text
    ids = client.completions.create(prompt=[10, 20, 30, 40], **base)
    lists = client.completions.create(prompt=[[10, 20, 30, 40], [50, 60]], **base)
    assert lists.choices[0].text == ids.choices[0].text
    assert ids.usage.prompt_tokens == 4 and lists.usage.prompt_tokens == 6
    streamed = client.completions.create(prompt="Once upon a time", stream=True, **base)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == one.choices[0].text


def test_logprobs(client):
    r = chat(client, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    entries = r.choices[0].logprobs.content
    assert len(entries) == 5
    for e in entries:
        assert e.logprob <= 0
        assert len(e.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    c = chat(client, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2, stream=True,
             extra_body={"ignore_eos": True})
    streamed = [e for ch in c if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in entries[:3]]
    lc = client.completions.create(model=MODEL, prompt="abc", max_tokens=4, temperature=0, logprobs=2,
                                   extra_body={"ignore_eos": True})
    lp = lc.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs)


def test_n_choices_and_seeds(client):
    kw = dict(max_tokens=12, temperature=1.0, top_p=1.0, extra_body={"ignore_eos": True, "top_k": 0})
    a = chat(client, seed=1234, n=3, **kw)
    b = chat(client, seed=1234, n=3, **kw)
    assert len(a.choices) == 3 and [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert a.usage.completion_tokens == 36
    # Different seeds (choice i uses seed + i) give different samples at temperature 1 on a random model.
    assert len({(c.message.reasoning_content or "") + (c.message.content or "") for c in a.choices}) > 1
    c = chat(client, seed=99, **kw)
    assert (c.choices[0].message.reasoning_content, c.choices[0].message.content) != (
        a.choices[0].message.reasoning_content, a.choices[0].message.content)
    streamed = list(chat(client, seed=1234, n=2, stream=True, **kw))
    by_index = {}
    for ch in streamed:
        for choice in ch.choices:
            d = choice.delta
            by_index[choice.index] = by_index.get(choice.index, "") + (d.model_extra.get("reasoning_content") or "") + (
                d.content or "")
    assert by_index[0] == (a.choices[0].message.reasoning_content or "") + (a.choices[0].message.content or "")
    assert by_index[1] == (a.choices[1].message.reasoning_content or "") + (a.choices[1].message.content or "")


def test_stop_strings_across_tokens(client):
    kw = dict(model=MODEL, prompt="The quick brown fox", max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(logprobs=0, **kw).choices[0]
    tokens = full.logprobs.tokens
    # A stop string that starts inside one token and ends inside the next (ASCII tokens, so their text is
    # exactly the output's).
    k = next(i for i in range(len(tokens) // 3, len(tokens) - 1)
             if len(tokens[i]) >= 2 and tokens[i].isascii() and tokens[i + 1].isascii() and tokens[i + 1])
    stop = tokens[k][1:] + tokens[k + 1][:1]
    cut = full.text[:full.text.index(stop)]
    r = client.completions.create(stop=[stop, "never-there"], **kw)
    assert r.choices[0].text == cut
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(stop=stop, stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == cut
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    # The chat API matches stop strings in the reasoning too, and never shows them.
    text = chat(client, max_tokens=40, temperature=0, extra_body={"ignore_eos": True}).choices[0].message
    whole = text.reasoning_content or text.content
    stop = whole[10:14]
    r = chat(client, max_tokens=40, temperature=0, stop=stop, extra_body={"ignore_eos": True}).choices[0]
    assert r.finish_reason == "stop"
    assert stop not in (r.message.reasoning_content or "") + (r.message.content or "")


def test_stop_token_ids_max_tokens_and_ignore_eos(client, server):
    forced = "alpha beta gamma delta"
    ids = server.post("/tokenize", {"prompt": forced}).json()["tokens"]
    assert len(ids) >= 4
    r = chat(client, max_tokens=50, extra_body={"deltaflow_forced_tokens": forced, "stop_token_ids": [ids[2]],
                                                "enable_thinking": False})
    text = server.post("/detokenize", {"tokens": ids[:2]}).json()["prompt"]
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 3
    # The eos token ends a reply unless ignore_eos.
    r = chat(client, max_tokens=5, extra_body={"deltaflow_forced_tokens": "<|im_end|>"})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1
    r = chat(client, max_tokens=5, extra_body={"deltaflow_forced_tokens": "<|im_end|>", "ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    r = chat(client, max_completion_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3


def test_generation_config_defaults(start_server, model_dir, tmp_path):
    # The tiny checkpoint samples by default (temperature 0.6): two unseeded replies differ.
    gd = tmp_path / "greedy"
    gd.mkdir()
    for f in os.listdir(model_dir):
        (gd / f).symlink_to(os.path.join(model_dir, f))
    (gd / "generation_config.json").unlink()
    cfg = json.load(open(os.path.join(model_dir, "generation_config.json")))
    cfg["do_sample"] = False
    (gd / "generation_config.json").write_text(json.dumps(cfg))
    sampled = start_server()
    greedy = start_server(model=str(gd))
    kw = dict(model=MODEL, prompt="Hello", max_tokens=24, extra_body={"ignore_eos": True})
    s = [sampled.openai().completions.create(**kw).choices[0].text for _ in range(3)]
    assert len(set(s)) > 1
    g = [greedy.openai().completions.create(**kw).choices[0].text for _ in range(2)]
    assert g[0] == g[1] == sampled.openai().completions.create(temperature=0, **kw).choices[0].text


def test_tokenize_detokenize(server):
    r = server.post("/tokenize", {"model": MODEL, "prompt": "Hello world", "return_token_strs": True}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 4096
    assert len(r["token_strs"]) == r["count"]
    assert server.post("/detokenize", {"model": MODEL, "tokens": r["tokens"]}).json()["prompt"] == "Hello world"
    chat_ids = server.post("/tokenize", {"messages": HELLO}).json()
    text = server.post("/detokenize", {"tokens": chat_ids["tokens"]}).json()["prompt"]
    assert text.startswith("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n")
