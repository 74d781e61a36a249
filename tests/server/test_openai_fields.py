"""The OpenAI fields tools rely on, through the official `openai` client: completions `echo` with prompt
`logprobs` and `max_tokens: 0` (lm-evaluation-harness's log-likelihood request) equal to `deltaflow eval`,
`logit_bias`, `best_of`, vLLM's `prompt_logprobs`, `suffix` refused; and CORS (`--allowed-origins`)."""
import json
import math
import subprocess

import httpx
import openai
import pytest

from conftest import MODEL, deltaflow_bin

HELLO = [{"role": "user", "content": "Hello there"}]


def eval_logprobs(model_dir, ids):
    p = subprocess.run([deltaflow_bin(), "eval", "--model", model_dir, "--device", "cpu", "--ids",
                        ",".join(map(str, ids)), "--json"], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(p.stdout)["logprobs"]


def test_echo_max_tokens_zero_equals_eval(client, server, model_dir):
    # What lm-evaluation-harness sends for loglikelihood: token ids, echo, logprobs, max_tokens 0.
    ids = server.post("/tokenize", {"prompt": "The quick brown fox jumps over the lazy dog"}).json()["tokens"]
    r = client.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=1, max_tokens=0, temperature=0)
    c = r.choices[0]
    ref = eval_logprobs(model_dir, ids)
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    assert c.logprobs.token_logprobs[1:] == ref  # the same scoring, bit for bit
    assert len(c.logprobs.tokens) == len(ids)
    assert c.text == server.post("/detokenize", {"tokens": ids}).json()["prompt"]
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    # top_logprobs holds the most likely token; lm-eval's is_greedy compares it with the actual one.
    for i in range(1, len(ids)):
        (tok, lp), = c.logprobs.top_logprobs[i].items()
        assert lp >= c.logprobs.token_logprobs[i] - 1e-6
    # text_offset walks the echoed text.
    assert c.logprobs.text_offset[0] == 0
    for i in range(1, len(ids)):
        assert c.logprobs.text_offset[i] == c.logprobs.text_offset[i - 1] + len(c.logprobs.tokens[i - 1])


def test_echo_of_a_prompt_longer_than_the_context_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[5] * 5000, echo=True, logprobs=1, max_tokens=0)
    assert e.value.body["code"] == "context_length_exceeded"


def test_echo_with_text_prompt_and_generation(client, server):
    prompt = "def add(a, b):"
    r = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=2, max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    plain = client.completions.create(model=MODEL, prompt=prompt, logprobs=2, max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})
    c = r.choices[0]
    n_prompt = server.post("/tokenize", {"prompt": prompt}).json()["count"]
    assert c.text == prompt + plain.choices[0].text
    assert len(c.logprobs.tokens) == n_prompt + 5
    assert c.logprobs.token_logprobs[n_prompt:] == plain.choices[0].logprobs.token_logprobs
    assert all(len(t) == 2 for t in c.logprobs.top_logprobs[1:])
    # Streamed: the echo comes first, then the completion.
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, echo=True, max_tokens=5, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].text == prompt
    assert "".join(ch.choices[0].text for ch in chunks) == c.text


def test_prompt_logprobs_on_chat_equal_eval(client, server, model_dir):
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, temperature=0,
                                       extra_body={"prompt_logprobs": 2, "enable_thinking": False})
    ids = server.post("/tokenize", {"messages": HELLO, "chat_template_kwargs": {"enable_thinking": False}}).json()["tokens"]
    plp = r.model_extra["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    ref = eval_logprobs(model_dir, ids)
    for i in range(1, len(ids)):
        entry = plp[i][str(ids[i])]
        assert entry["logprob"] == ref[i - 1]
        assert entry["rank"] >= 1
        assert {1, 2} <= {e["rank"] for e in plp[i].values()}
        assert len(plp[i]) in (2, 3)  # the prompt token and the top 2 (it may be one of them)
        if entry["rank"] <= 2:  # then every token above it is listed
            assert entry["rank"] == 1 + sum(1 for e in plp[i].values() if e["logprob"] > entry["logprob"])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, stream=True,
                                       extra_body={"prompt_logprobs": 1}).close()
    assert e.value.body["param"] == "prompt_logprobs"


def test_prompt_logprobs_on_completions(client, model_dir, server):
    ids = server.post("/tokenize", {"prompt": "import os"}).json()["tokens"]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, extra_body={"prompt_logprobs": 0})
    plp = r.choices[0].model_extra["prompt_logprobs"]
    ref = eval_logprobs(model_dir, ids)
    assert plp[0] is None and [plp[i][str(ids[i])]["logprob"] for i in range(1, len(ids))] == ref


def test_logit_bias(client, server):
    kw = dict(model=MODEL, prompt="Hello", max_tokens=6, logprobs=0, extra_body={"ignore_eos": True})
    a, b = 65, 66
    ta, tb = base_token(server, a), base_token(server, b)
    assert ta != tb
    for temperature in (0, 1.0):
        # +100 on one token: every token is that one, greedy or sampled; -100 takes it out again.
        r = client.completions.create(logit_bias={str(a): 100, str(b): 90}, temperature=temperature, seed=3, **kw)
        assert r.choices[0].logprobs.tokens == [ta] * 6
        r = client.completions.create(logit_bias={str(a): -100, str(b): 90}, temperature=temperature, seed=3, **kw)
        assert r.choices[0].logprobs.tokens == [tb] * 6
    c = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0, logprobs=True,
                                       logit_bias={str(a): 100}, extra_body={"ignore_eos": True})
    assert [e.token for e in c.choices[0].logprobs.content] == [ta] * 4
    # Without logprobs the request still samples on the host path, where the bias applies.
    r = client.completions.create(**dict(kw, logprobs=None, temperature=0, logit_bias={str(a): 100}))
    assert r.choices[0].text == server.post("/detokenize", {"tokens": [a] * 6}).json()["prompt"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**dict(kw, logit_bias={"99999999": 1}))
    assert e.value.body["param"] == "logit_bias"


def base_token(server, token_id):
    return server.post("/detokenize", {"tokens": [token_id]}).json()["prompt"]


def test_best_of_returns_the_most_likely_candidates(client):
    kw = dict(model=MODEL, prompt="Once upon", max_tokens=8, temperature=1.0, seed=11, extra_body={"ignore_eos": True})
    all4 = client.completions.create(n=4, logprobs=0, **kw)
    sums = [sum(c.logprobs.token_logprobs) for c in all4.choices]
    best = client.completions.create(n=1, best_of=4, **kw)
    assert len(best.choices) == 1 and best.choices[0].logprobs is None
    assert best.choices[0].text == all4.choices[max(range(4), key=lambda i: sums[i])].text
    two = client.completions.create(n=2, best_of=4, logprobs=0, **kw)
    order = sorted(range(4), key=lambda i: -sums[i])
    assert [c.text for c in two.choices] == [all4.choices[i].text for i in order[:2]]
    assert [c.index for c in two.choices] == [0, 1]
    assert best.usage.completion_tokens == 32  # every candidate counts
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(n=1, best_of=2, stream=True, **kw).close()
    assert e.value.body["param"] == "best_of"


def test_suffix_is_refused_clearly(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="def f(", suffix="):\n    pass", max_tokens=4)
    assert e.value.body["param"] == "suffix" and "fill-in-the-middle" in e.value.body["message"]


def preflight(server, origin, headers="authorization,content-type"):
    return httpx.request("OPTIONS", server.url + "/v1/chat/completions", timeout=10,
                         headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                  "Access-Control-Request-Headers": headers})


def test_cors_default_is_no_origin(server):
    r = preflight(server, "https://evil.example")
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    # A cross-origin "simple" POST from a page elsewhere does not run either.
    r = server.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    # The server's own page is same-origin (and the refused request above left the connection usable).
    r = server.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, headers={"Origin": server.url})
    assert r.status_code == 200


def test_cors_allowed_origins(start_server):
    s = start_server("--allowed-origins", "https://app.example, http://localhost:5173")
    r = preflight(s, "https://app.example")
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-headers"] == "authorization,content-type"
    assert int(r.headers["access-control-max-age"]) > 0
    assert "Origin" in r.headers["vary"]
    # The real request carries the header, and so do its errors (so the page can read them).
    ok = s.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1}, headers={"Origin": "http://localhost:5173"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://localhost:5173"
    bad = httpx.post(s.url + "/v1/completions", json={"prompt": "x"}, headers={"Origin": "https://app.example"})
    assert bad.status_code == 401 and bad.headers["access-control-allow-origin"] == "https://app.example"
    assert preflight(s, "https://other.example").status_code == 403
    star = start_server("--allowed-origins", "*")
    assert preflight(star, "https://anything.example").headers["access-control-allow-origin"] == "https://anything.example"


def test_cors_flag_errors():
    for bad in ("", "app.example", "https://a.example/path", "https://a.example,,"):
        p = subprocess.run([deltaflow_bin(), "serve", "--allowed-origins", bad], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1 and "--allowed-origins" in p.stderr


def test_refused_post_leaves_the_kept_alive_connection_usable(server):
    # A 401 is answered before the body is read; the connection is closed so the body is not taken for the
    # next request on it.
    body = {"model": MODEL, "prompt": "x" * 2000, "max_tokens": 1}
    assert server.post("/v1/completions", body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert server.post("/v1/completions", body).status_code == 200
