"""Many clients at once: the HTTP side serves them concurrently and queues their generations for the one
engine thread; a client that disconnects mid-stream (or mid-wait) cancels its generation, and the server
goes on serving."""
import concurrent.futures
import socket
import time

import httpx

from conftest import MODEL


def test_fifty_concurrent_clients(server):
    client = server.openai(timeout=120)

    def one(i):
        kw = dict(model=MODEL, max_tokens=8, temperature=0.7, seed=i, extra_body={"ignore_eos": True})
        if i % 3 == 0:
            chunks = list(client.chat.completions.create(messages=[{"role": "user", "content": "hi %d" % i}],
                                                         stream=True, stream_options={"include_usage": True}, **kw))
            return chunks[-1].usage.completion_tokens
        if i % 3 == 1:
            r = client.chat.completions.create(messages=[{"role": "user", "content": "hi %d" % i}], **kw)
            return r.usage.completion_tokens
        r = client.completions.create(prompt="count %d" % i, **kw)
        return r.usage.completion_tokens

    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(one, range(50), timeout=180))
    assert results == [8] * 50
    assert time.time() - start < 180
    assert server.wait_idle(10)


def test_disconnect_mid_stream_cancels(server):
    before = server.metric("deltaflow_generation_tokens_total")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 3500, "n": 4,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=server.headers(),
                      timeout=30) as r:
        assert r.status_code == 200
        got = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                got += 1
            if got >= 5:
                break
    # Closed. The engine notices at its next write and stops long before the 4 x 3500 tokens.
    assert server.wait_idle(20)
    after = server.metric("deltaflow_generation_tokens_total")
    assert after - before < 4 * 3500
    r = server.openai().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "still there?"}],
                                                max_tokens=3)
    assert r.usage.completion_tokens >= 1


def test_disconnect_while_waiting_non_streaming(server):
    before = server.metric("deltaflow_generation_tokens_total")
    body = (b'{"model": "tiny", "prompt": "x", "max_tokens": 3500, "n": 4, "ignore_eos": true}')
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer " +
           server.api_key.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(req)
    time.sleep(0.5)
    sock.close()
    # The whitespace the server writes while waiting fails on the closed socket: the run is cancelled.
    assert server.wait_idle(20)
    after = server.metric("deltaflow_generation_tokens_total")
    assert after - before < 4 * 3500
    assert httpx.get(server.url + "/health").status_code == 200


def test_slow_non_streaming_reply_is_valid_json(server):
    # Longer than the 1 s inline wait: the body comes chunked after leading whitespace, still valid JSON.
    r = server.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1200, "ignore_eos": True},
                    timeout=120)
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 1200
