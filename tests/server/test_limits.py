"""Resource limits (issue 26 item 4): --max-request-bytes (413 with an OpenAI-style body, also for chunked
uploads), --max-tokens-limit (400 naming the field; defaults and Ollama's unlimited capped)."""
import json

import httpx
import openai
import pytest

from conftest import MODEL

HELLO = [{"role": "user", "content": "Hello"}]


def error_of(r, status):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert isinstance(e["message"], str) and e["message"]
    return e


@pytest.fixture(scope="module")
def limited(model_dir):
    from conftest import Server
    s = Server(model_dir, "--quiet", "--max-request-bytes", "4096", "--max-tokens-limit", "16")
    yield s
    assert s.stop() == 0


def test_body_over_max_request_bytes_is_413(limited):
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "a" * 5000}]}).encode()
    e = error_of(limited.post("/v1/chat/completions", content=body,
                              headers={"Content-Type": "application/json"}), 413)
    assert e["code"] == "request_too_large" and "4096" in e["message"] and "--max-request-bytes" in e["message"]
    # Sent chunked (no Content-Length): refused too, not read whole.
    def chunks():
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]
    r = httpx.post(limited.url + "/v1/chat/completions", content=chunks(),
                   headers=dict(limited.headers(), **{"Content-Type": "application/json"}), timeout=30)
    assert r.status_code == 413, r.text
    # The official client sees a 413 APIStatusError.
    with pytest.raises(openai.APIStatusError) as ex:
        limited.openai().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a" * 5000}])
    assert ex.value.status_code == 413
    # Just under the limit is served.
    ok = limited.openai().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a" * 3000}],
                                                  max_tokens=1)
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_max_tokens_over_the_limit_is_400(limited):
    c = limited.openai()
    with pytest.raises(openai.BadRequestError) as ex:
        c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=17)
    assert ex.value.body["param"] == "max_tokens" and "at most 16" in ex.value.body["message"]
    with pytest.raises(openai.BadRequestError) as ex:
        c.chat.completions.create(model=MODEL, messages=HELLO, max_completion_tokens=1000)
    assert ex.value.body["param"] == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as ex:
        c.completions.create(model=MODEL, prompt="x", max_tokens=100)
    assert ex.value.body["param"] == "max_tokens"
    r = c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=16, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16


def test_default_max_tokens_is_capped_by_the_limit(limited):
    r = limited.openai().completions.create(model=MODEL, prompt="x", extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def test_ollama_num_predict_over_the_limit(limited):
    r = limited.post("/api/generate", {"model": MODEL, "prompt": "x", "stream": False,
                                       "options": {"num_predict": 100}})
    assert r.status_code == 400 and "options.num_predict" in r.json()["error"]
    r = limited.post("/api/generate", {"model": MODEL, "prompt": "x", "stream": False, "raw": True,
                                       "options": {"num_predict": -1}})
    assert r.status_code == 200 and r.json()["eval_count"] <= 16


def test_flag_errors(model_dir):
    from conftest import deltaflow_bin
    import subprocess
    p = subprocess.run([deltaflow_bin(), "serve", "--model", model_dir, "--max-tokens-limit", "-3"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and p.stderr.count("\n") == 1 and "--max-tokens-limit" in p.stderr
    p = subprocess.run([deltaflow_bin(), "serve", "--model", model_dir, "--max-request-bytes", "10"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and p.stderr.count("\n") == 1 and "--max-request-bytes" in p.stderr


def test_prompt_alone_over_the_context_says_so(server):
    # No max_tokens: the message speaks of the prompt, never of a negative completion.
    r = server.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a " * 5000}]})
    e = error_of(r, 400)
    assert e["code"] == "context_length_exceeded" and e["param"] == "messages"
    assert "-" not in e["message"].split("tokens.")[-1] and "resulted in" in e["message"]
