"""Connections (issue 26): slow and idle clients hold no thread and starve nobody, a short body times out,
pipelined requests are answered in order, the connection cap answers 503 at once, and the gauges of
/metrics count connections. Real sockets against `deltaflow serve`; the official openai client for the
well-behaved traffic."""
import json
import socket
import statistics
import time

import pytest

from conftest import API_KEY, MODEL


def raw_request(method, path, body=b"", extra=b""):
    head = b"%s %s HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\n" % (method.encode(), path.encode(),
                                                                           API_KEY.encode())
    if body:
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    return head + extra + b"\r\n" + body


def read_responses(sock, n, timeout=20):
    """Reads n responses (Content-Length framed) from sock; returns [(status, body)]."""
    sock.settimeout(timeout)
    buf = b""
    out = []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, "closed after %d responses: %r" % (len(out), buf)
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ")[1])
        length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
        assert length, head
        while len(rest) < length[0]:
            chunk = sock.recv(65536)
            assert chunk
            rest += chunk
        out.append((status, rest[:length[0]]))
        buf = rest[length[0]:]
    return out


def ttft(client, i):
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi %d" % i}],
                                            max_tokens=2, stream=True, temperature=0)
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content is not None:
            first = time.perf_counter() - t0
    return first


def test_slow_clients_do_not_starve_a_well_behaved_one(start_server):
    s = start_server("--header-timeout", "30")
    client = s.openai()
    ttft(client, -1)  # warm
    unloaded = sorted(ttft(client, i) for i in range(10))
    slow = []
    for i in range(300):
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Le")  # and then nothing
        slow.append(sock)
    try:
        assert s.metric("deltaflow_http_connections") >= 300
        loaded = sorted(ttft(client, i) for i in range(10))
    finally:
        for sock in slow:
            sock.close()
    print("TTFT unloaded median %.1f ms max %.1f ms; with 300 slow clients median %.1f ms max %.1f ms" % (
        1e3 * statistics.median(unloaded), 1e3 * unloaded[-1], 1e3 * statistics.median(loaded), 1e3 * loaded[-1]))
    # The bound is loose for a shared 2-core CI machine; tests/load/ measures the p99 target.
    assert statistics.median(loaded) < 2 * statistics.median(unloaded) + 0.05


def test_slow_head_and_short_body_get_408(start_server):
    s = start_server("--header-timeout", "1", "--body-timeout", "1")
    t0 = time.time()
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as a, \
            socket.create_connection(("127.0.0.1", s.port), timeout=10) as b:
        a.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n")
        b.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{")
        for sock in (a, b):
            data = sock.recv(65536)
            assert data.startswith(b"HTTP/1.1 408"), data
            body = json.loads(data.split(b"\r\n\r\n", 1)[1])
            assert "in time" in body["error"]["message"]
    assert time.time() - t0 < 5
    assert s.get("/health").status_code == 200


def test_pipelined_requests_are_answered_in_order(server):
    one = json.dumps({"model": MODEL, "prompt": "one", "max_tokens": 2, "temperature": 0}).encode()
    two = json.dumps({"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(raw_request("POST", "/v1/completions", one) + raw_request("GET", "/v1/models") +
                     raw_request("POST", "/v1/completions", two))
        (s1, b1), (s2, b2), (s3, b3) = read_responses(sock, 3)
    assert (s1, s2, s3) == (200, 200, 200)
    assert json.loads(b1)["usage"]["completion_tokens"] == 2
    assert json.loads(b2)["data"][0]["id"] == MODEL
    assert json.loads(b3)["usage"]["prompt_tokens"] == 3


def test_connections_past_the_cap_get_503(start_server):
    s = start_server("--max-connections", "8")
    held = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(8)]
    try:
        deadline = time.time() + 5
        while time.time() < deadline:
            with socket.create_connection(("127.0.0.1", s.port), timeout=5) as extra:
                data = extra.recv(65536)
            if data.startswith(b"HTTP/1.1 503"):
                break
            time.sleep(0.05)
        assert data.startswith(b"HTTP/1.1 503"), data
        body = json.loads(data.split(b"\r\n\r\n", 1)[1])
        assert "connection limit" in body["error"]["message"]
        assert b"Retry-After: 1" in data
    finally:
        for sock in held:
            sock.close()
    # Freed: served again.
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            if s.get("/health").status_code == 200:
                break
        except Exception:
            time.sleep(0.05)
    assert s.get("/health").status_code == 200


def test_connection_gauges_count_and_return(server):
    # Other tests' clients may keep idle connections open (keep-alive): count from what is open now.
    base = server.metric("deltaflow_http_connections")
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(20)]
    deadline = time.time() + 5
    while server.metric("deltaflow_http_connections") < base + 20 and time.time() < deadline:
        time.sleep(0.05)
    assert server.metric("deltaflow_http_connections") >= base + 20
    for sock in socks:
        sock.close()
    deadline = time.time() + 5
    while server.metric("deltaflow_http_connections") > base and time.time() < deadline:
        time.sleep(0.05)
    assert server.metric("deltaflow_http_connections") <= base
    assert server.metric("deltaflow_http_requests_in_flight") == 1  # the /metrics request itself


@pytest.mark.parametrize("flag,value", [("--max-connections", "0"), ("--header-timeout", "0"),
                                        ("--keep-alive-timeout", "abc")])
def test_connection_flag_errors(model_dir, flag, value):
    import subprocess
    from conftest import deltaflow_bin
    r = subprocess.run([deltaflow_bin(), "serve", "--model", model_dir, "--device", "cpu", "--port", "0", flag, value],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert flag in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
