"""Graceful shutdown (issue 26 item 2): on SIGTERM the server stops accepting, lets running requests finish up to
--shutdown-timeout, then aborts the rest with a clean final event (finish_reason "abort" and [DONE]), and exits 0."""
import json
import signal
import threading
import time

import httpx

from conftest import MODEL, Server


def stream_lines(server, max_tokens, on_first):
    """Streams a chat completion; calls on_first() after the first chunk; returns the data lines."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count for me."}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "enable_thinking": False}
    lines = []
    with httpx.Client(timeout=120) as c:
        with c.stream("POST", server.url + "/v1/chat/completions", json=body, headers=server.headers()) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                lines.append(line[len("data: "):])
                if len(lines) == 2:
                    on_first()
    return lines


def chunks_of(lines):
    assert lines[-1] == "[DONE]", lines[-3:]
    return [json.loads(x) for x in lines[:-1]]


def test_sigterm_lets_a_running_stream_finish_and_exits_0(model_dir):
    s = Server(model_dir, "--quiet")
    refused = {}

    def on_first():
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # No new work: the listening socket is closed (or, on a connection read before, a 503).
        try:
            r = httpx.post(s.url + "/v1/chat/completions", headers=s.headers(), timeout=5,
                           json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
            refused["status"] = r.status_code
            refused["body"] = r.json()
        except httpx.TransportError as e:
            refused["status"] = type(e).__name__

    lines = stream_lines(s, 2500, on_first)
    chunks = chunks_of(lines)
    assert finish_reasons(chunks) == ["length"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text
    assert refused["status"] in ("ConnectError", 503), refused
    if refused["status"] == 503:
        assert refused["body"]["error"]["type"] == "service_unavailable"
    assert s.proc.wait(30) == 0, "".join(s.log)
    # The stream was running when the signal came, and was let finish.
    assert any("stopping: no new requests; 1 running" in l for l in s.log), "".join(s.log)
    assert not any("aborting" in l for l in s.log), "".join(s.log)


def finish_reasons(chunks):
    return [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]


def test_shutdown_timeout_aborts_with_a_clean_final_event(model_dir):
    s = Server(model_dir, "--quiet", "--shutdown-timeout", "1")
    t = {}

    def on_first():
        t["signal"] = time.time()
        s.proc.send_signal(signal.SIGTERM)

    lines = stream_lines(s, 3900, on_first)
    t["end"] = time.time()
    chunks = chunks_of(lines)
    assert finish_reasons(chunks) == ["abort"]
    assert 0.8 < t["end"] - t["signal"] < 15
    assert s.proc.wait(30) == 0, "".join(s.log)
    assert any("--shutdown-timeout reached" in l for l in s.log), "".join(s.log)


def test_non_streaming_request_aborted_at_shutdown_gets_its_answer(model_dir):
    s = Server(model_dir, "--quiet", "--shutdown-timeout", "0.5")
    out = {}

    def call():
        out["r"] = httpx.post(s.url + "/v1/completions", headers=s.headers(), timeout=60,
                              json={"model": MODEL, "prompt": "x", "max_tokens": 3900, "ignore_eos": True})

    th = threading.Thread(target=call)
    th.start()
    deadline = time.time() + 30
    while time.time() < deadline and s.metric("deltaflow_num_requests_running") != 1:
        time.sleep(0.02)
    s.proc.send_signal(signal.SIGTERM)
    th.join(30)
    r = out["r"]
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "abort"
    assert body["usage"]["completion_tokens"] > 0
    assert s.proc.wait(30) == 0, "".join(s.log)
