"""Fixtures for the server suite: a tiny random checkpoint (deltaflow make-tiny) served on 127.0.0.1 on a
free port by `deltaflow serve` on the CPU backend, and clients for it.

Environment: DELTAFLOW_BIN (the deltaflow binary; required), DF_SOURCE_DIR (unused here, set by CI).
"""
import os
import re
import signal
import subprocess
import threading
import time

import httpx
import openai
import pytest

API_KEY = "test-key-0123456789"
MODEL = "tiny"


def deltaflow_bin():
    path = os.environ.get("DELTAFLOW_BIN")
    if not path or not os.path.exists(path):
        pytest.fail("set DELTAFLOW_BIN to the deltaflow binary (got %r)" % path)
    return path


class Server:
    """A running `deltaflow serve`; stderr is collected for failure messages."""

    def __init__(self, model_dir, *extra, api_key=API_KEY, ready_timeout=60, served_name=MODEL):
        # model_dir None: the built-in default model; served_name None: the directory's name.
        args = [deltaflow_bin(), "serve", "--host", "127.0.0.1", "--port", "0", "--device", "cpu"]
        if model_dir:
            args += ["--model", model_dir]
        if served_name:
            args += ["--served-model-name", served_name]
        if api_key:
            args += ["--api-key", api_key]
        args += list(extra)
        self.api_key = api_key
        self.clients = []
        env = dict(os.environ, DELTAFLOW_THREADS=os.environ.get("DELTAFLOW_THREADS", "2"))
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        self.log = []
        self.port = None
        port_seen = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    port_seen.set()
            port_seen.set()

        self.reader = threading.Thread(target=pump, daemon=True)
        self.reader.start()
        if not port_seen.wait(ready_timeout) or self.port is None:
            self.stop()
            raise RuntimeError("server did not start:\n" + "".join(self.log))
        self.url = "http://127.0.0.1:%d" % self.port
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("server never became healthy:\n" + "".join(self.log))

    def headers(self):
        return {"Authorization": "Bearer " + self.api_key} if self.api_key else {}

    def openai(self, **kw):
        kw.setdefault("timeout", 60)
        kw.setdefault("max_retries", 0)
        c = openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key or "none", **kw)
        self.clients.append(c)
        return c

    def http(self):
        # One pooled client per thread: creating an httpx client costs tens of milliseconds (TLS setup).
        local = self.__dict__.setdefault("_local", threading.local())
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=60)
            self.clients.append(local.client)
        return local.client

    def post(self, path, json=None, **kw):
        headers = dict(self.headers(), **kw.pop("headers", {}))
        return self.http().post(self.url + path, json=json, headers=headers, **kw)

    def get(self, path, **kw):
        headers = dict(self.headers(), **kw.pop("headers", {}))
        return self.http().get(self.url + path, headers=headers, **kw)

    def metric(self, name):
        text = self.get("/metrics").text
        m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
        return float(m.group(1)) if m else None

    def wait_idle(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.metric("deltaflow_num_requests_running") == 0 and self.metric("deltaflow_num_requests_waiting") == 0:
                return True
            time.sleep(0.05)
        return False

    def stop(self):
        # Idle kept-alive connections hold server threads until their timeout: close ours first so the
        # shutdown is quick.
        for c in self.clients:
            c.close()
        self.clients = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-dense")
    subprocess.run([deltaflow_bin(), "make-tiny", "--preset", "dense", "--seed", "1", "--out", str(out)], check=True)
    return str(out)


@pytest.fixture(scope="session")
def server(model_dir):
    s = Server(model_dir, "--enable-test-hooks", "--max-body-bytes", "1048576", "--quiet")
    yield s
    rc = s.stop()
    assert rc == 0, "server exited with %r:\n%s" % (rc, "".join(s.log))


@pytest.fixture(scope="session")
def client(server):
    return server.openai()


@pytest.fixture
def start_server(model_dir):
    """Starts extra servers with other flags; they are stopped after the test."""
    started = []

    def start(*extra, model=None, api_key=API_KEY):
        s = Server(model or model_dir, "--quiet", *extra, api_key=api_key)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
