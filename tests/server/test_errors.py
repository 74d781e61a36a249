"""Errors as OpenAI error JSON (400 naming the field, 401, 404, 413, 429, context_length_exceeded), auth on
every route but /health, and hostile input that must not bring the server down."""
import os
import random
import socket
import threading
import time

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


def test_bad_json(server):
    r = server.post("/v1/chat/completions", content=b'{"model": "tiny", "messages": [', headers={
        "Content-Type": "application/json"})
    assert "not valid JSON" in error_of(r, 400)["message"]
    r = server.post("/v1/chat/completions", content=b'[1, 2]', headers={"Content-Type": "application/json"})
    error_of(r, 400)


@pytest.mark.parametrize("field,value", [
    ("temperature", "hot"), ("temperature", -1), ("temperature", 7), ("top_p", 0), ("top_p", "x"), ("top_k", 1.5),
    ("min_p", 2), ("max_tokens", -5), ("max_tokens", "ten"), ("max_completion_tokens", 0), ("n", 0), ("n", 99),
    ("seed", "abc"), ("stop", 5), ("stop", [1, 2]), ("stop_token_ids", ["a"]), ("stop_token_ids", [10 ** 9]),
    ("presence_penalty", 3), ("frequency_penalty", "x"), ("repetition_penalty", 0), ("logprobs", "yes"),
    ("top_logprobs", 50), ("stream", "yes"), ("stream_options", 3), ("ignore_eos", 1), ("messages", "hi"),
    ("messages", []), ("messages", [{"content": "no role"}]), ("messages", [{"role": "wizard", "content": "x"}]),
    ("messages", [{"role": "user", "content": 5}]), ("model", 5), ("response_format", {"type": "json_schema"}),
    ("chat_template_kwargs", "x"), ("enable_thinking", "maybe"), ("thinking_token_budget", "x"),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
])
def test_wrong_types_name_the_field(server, field, value):
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 4}
    body[field] = value
    e = error_of(server.post("/v1/chat/completions", body), 400)
    assert e["param"] and e["param"].split("[")[0].split(".")[0] == field, e
    assert e["type"] == "invalid_request_error"


def test_top_logprobs_without_logprobs(server):
    e = error_of(server.post("/v1/chat/completions", {"model": MODEL, "messages": HELLO, "top_logprobs": 2}), 400)
    assert e["param"] == "top_logprobs"


def test_completions_field_errors(server):
    for prompt in (None, 5, [], [1, "a"], [[1], "x"], [-1], [10 ** 6]):
        body = {"model": MODEL, "max_tokens": 3}
        if prompt is not None:
            body["prompt"] = prompt
        assert error_of(server.post("/v1/completions", body), 400)["param"] == "prompt"
    e = error_of(server.post("/v1/completions", {"prompt": "x", "suffix": "y", "max_tokens": 2}), 400)
    assert e["param"] == "suffix" and "fill-in-the-middle" in e["message"]
    e = error_of(server.post("/v1/completions", {"prompt": "x", "max_tokens": 0}), 400)
    assert e["param"] == "max_tokens" and "echo" in e["message"]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-9", messages=HELLO, max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_unknown_route_is_404_json(server):
    error_of(server.get("/v1/nothing"), 404)


def test_context_length_exceeded(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4090)
    assert e.value.body["code"] == "context_length_exceeded"
    long_prompt = [10 + i % 900 for i in range(3990)]
    r = server.post("/v1/completions", {"model": MODEL, "prompt": long_prompt, "max_tokens": 200})
    e = error_of(r, 400)
    assert e["code"] == "context_length_exceeded" and e["param"] == "prompt"
    # Without max_tokens the reply may fill the context: a prompt that already fills it is refused.
    r = server.post("/v1/completions", {"model": MODEL, "prompt": [10 + i % 900 for i in range(4096)]})
    assert error_of(r, 400)["code"] == "context_length_exceeded"


def test_max_model_len_flag(start_server):
    s = start_server("--max-model-len", "64")
    r = s.post("/v1/completions", {"model": MODEL, "prompt": list(range(10, 70)), "max_tokens": 10})
    assert error_of(r, 400)["code"] == "context_length_exceeded"
    r = s.post("/v1/completions", {"model": MODEL, "prompt": list(range(10, 50)), "max_tokens": 10})
    assert r.status_code == 200
    assert s.get("/v1/models").json()["data"][0]["max_model_len"] == 64


def test_oversized_body_is_413(server):
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"a" * (1 << 20) + b'"}]}'
    r = server.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    e = error_of(r, 413)
    assert "limit" in e["message"]


def test_deep_nesting_is_refused(server):
    body = '{"model": "tiny", "messages": ' + "[" * 5000 + "]" * 5000 + "}"
    error_of(server.post("/v1/chat/completions", content=body.encode()), 400)


def test_auth(server):
    url = server.url
    assert httpx.get(url + "/health").status_code == 200  # /health needs no key
    for path in ("/v1/models", "/metrics", "/api/tags", "/api/version", "/api/ps"):
        assert httpx.get(url + path).status_code == 401, path
        assert httpx.get(url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401, path
        assert httpx.get(url + path, headers={"Authorization": "Basic " + server.api_key}).status_code == 401
    for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/api/chat",
                 "/api/generate", "/api/show"):
        assert httpx.post(url + path, json={}).status_code == 401, path
    e = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer " + server.api_key[:-1]})
    assert error_of(e, 401)["type"] == "authentication_error"
    bad = openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert "error" in httpx.post(url + "/api/chat", json={}).json()


def test_public_host_needs_a_key(model_dir):
    from conftest import deltaflow_bin
    import subprocess
    r = subprocess.run([deltaflow_bin(), "serve", "--model", model_dir, "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--api-key" in r.stderr and "--insecure-no-auth" in r.stderr


def test_key_file(start_server, tmp_path):
    key = tmp_path / "key"
    key.write_text("from-a-file\n")
    s = start_server("--api-key-file", str(key), api_key=None)
    assert httpx.get(s.url + "/v1/models").status_code == 401
    assert httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer from-a-file"}).status_code == 200


def test_test_hook_is_off_by_default(start_server):
    s = start_server()
    r = s.post("/v1/chat/completions", {"model": MODEL, "messages": HELLO, "deltaflow_forced_tokens": "x"})
    assert error_of(r, 400)["param"] == "deltaflow_forced_tokens"


def test_garbage_does_not_crash(server):
    rng = random.Random(1234)
    paths = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/api/chat", "/api/generate",
             "/api/show"]
    samples = [b"", b"null", b"{}", b'{"messages": null}', b'{"prompt": {"a": 1}}', b"\xff\xfe\x00garbage",
               b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe"}], "max_tokens": 3}',
               b'{"model": "tiny", "prompt": "\xc3", "max_tokens": 2}', b'{"tokens": [1, 2, -3]}',
               b'{"model":"tiny","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{"}}]}]}',
               b'{"model":"tiny","messages":[{"role":"user","content":"x"}],"tools":[{"function":{"name":"f",'
               b'"parameters":{"properties":{"a":{"type":["integer",{"x":1}]}}}}}],"max_tokens":2}']
    for _ in range(40):
        n = rng.randrange(1, 200)
        samples.append(bytes(rng.randrange(256) for _ in range(n)))
        s = bytearray(b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stop":["a"]}')
        for _ in range(3):
            s[rng.randrange(len(s))] = rng.randrange(256)
        samples.append(bytes(s))
    for body in samples:
        for path in paths:
            r = server.post(path, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code in (200, 400, 404, 422), (path, body, r.status_code, r.text)
            if r.status_code != 200:
                assert "error" in r.json()
    # Raw protocol garbage.
    for junk in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                 b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", os.urandom(512)):
        with socket.create_connection(("127.0.0.1", server.port), timeout=1) as sock:
            sock.sendall(junk)
            try:
                sock.recv(4096)
            except OSError:
                pass
    assert httpx.get(server.url + "/health").status_code == 200
    assert server.post("/v1/completions", {"model": MODEL, "prompt": "ok", "max_tokens": 2}).status_code == 200


def test_queue_full_is_429(start_server):
    # One sequence at a time (--max-num-seqs 1): one runs, one waits in the queue of one, the next is refused.
    s = start_server("--max-queue", "1", "--max-num-seqs", "1")
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1500, "ignore_eos": True}
    results = []

    def go():
        try:
            results.append(s.post("/v1/completions", body, timeout=120).status_code)
        except httpx.HTTPError as e:
            results.append(repr(e))

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert sorted(set(results)) == [200, 429], results
    assert results.count(200) >= 2  # one ran, one waited
    assert s.post("/v1/completions", dict(body, max_tokens=2)).status_code == 200  # served again once idle


def test_queue_full_error_body(start_server):
    # One sequence at a time (--max-num-seqs 1): one runs, one waits in the queue of one, the next is refused.
    s = start_server("--max-queue", "1", "--max-num-seqs", "1")
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2500, "ignore_eos": True, "stream": True}
    streams = []
    try:
        for want_running in (1, 1):  # one running, then one waiting
            cm = httpx.stream("POST", s.url + "/v1/completions", json=body, headers=s.headers(), timeout=60)
            r = cm.__enter__()
            streams.append(cm)
            assert r.status_code == 200
            deadline = time.time() + 10
            while s.metric("deltaflow_num_requests_running") != want_running and time.time() < deadline:
                time.sleep(0.02)
        r = s.post("/v1/completions", body)
        e = error_of(r, 429)
        assert e["code"] == "queue_full"
    finally:
        for cm in streams:
            cm.__exit__(None, None, None)


def test_port_in_use_is_an_error(server, model_dir):
    from conftest import deltaflow_bin
    import subprocess
    r = subprocess.run([deltaflow_bin(), "serve", "--model", model_dir, "--port", str(server.port)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "cannot bind" in r.stderr
    assert httpx.get(server.url + "/health").status_code == 200


def test_bad_model_dir_fails_fast(tmp_path):
    from conftest import deltaflow_bin
    import subprocess
    r = subprocess.run([deltaflow_bin(), "serve", "--model", str(tmp_path / "missing"), "--port", "0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "config.json" in r.stderr
