"""Faults (issue 26): a full disk under `deltaflow batch` (a clear error, whole lines kept, --resume finishes
exactly), the model directory deleted while serving (requests go on), and a KV pool larger than memory at
load (one clear line, non-zero exit). GPU out-of-memory is checked on the GPU machine."""
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import time

import httpx
import pytest

from conftest import BIN, run
from test_batch import batch, content, requests, results, write_input


def small_filesystem(path, size_kib):
    """A tmpfs of size_kib at path (root only); None when mounting is not allowed here."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0 or os.environ.get("DF_TEST_NO_MOUNT"):
        return None
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dk" % size_kib, "tmpfs", path], capture_output=True)
    return path if r.returncode == 0 else None


def test_full_disk_under_batch_then_resume(tiny_models, tmp_path):
    inp = str(tmp_path / "in.jsonl")
    write_input(inp, requests(40))
    ref_path = str(tmp_path / "ref.jsonl")
    batch(tiny_models["dense"], inp, ref_path)
    ref = results(ref_path)
    assert os.path.getsize(ref_path) > 16 * 1024

    fs = small_filesystem(str(tmp_path / "small"), 16)
    try:
        if fs:  # a real full disk: ENOSPC
            out = os.path.join(fs, "out.jsonl")
            limit = None
        else:  # no mount here: a file size limit (EFBIG), with SIGXFSZ ignored as a full disk sends none
            out = str(tmp_path / "out.jsonl")
            limit = 16 * 1024

        def preexec():
            if limit:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        p = subprocess.run([BIN, "batch", "--model", tiny_models["dense"], "--device", "cpu", "--input", inp,
                            "--output", out], capture_output=True, text=True, timeout=600, preexec_fn=preexec)
        assert p.returncode != 0
        last = p.stderr.strip().splitlines()[-1]
        assert "write failed" in last and "--resume" in last, p.stderr
        written = open(out, "rb").read()
        assert 0 < len(written) <= 16 * 1024
        # Space again: the file moves to a roomy disk, and --resume finishes the job exactly.
        roomy = str(tmp_path / "resumed.jsonl")
        shutil.copy(out, roomy)
    finally:
        if fs:
            subprocess.run(["umount", fs], check=False)
    p = batch(tiny_models["dense"], inp, roomy, "--resume")
    final = results(roomy)
    assert sorted(final) == sorted(ref)
    for k in ref:
        assert content(final[k]) == content(ref[k]), k


def test_model_directory_deleted_while_serving(tiny_models, tmp_path):
    model = str(tmp_path / "model")
    shutil.copytree(tiny_models["dense"], model)
    proc = subprocess.Popen([BIN, "serve", "--model", model, "--device", "cpu", "--port", "0", "--quiet"],
                            stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        url = "http://127.0.0.1:%d" % port
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        body = {"model": "model", "prompt": "Once upon", "max_tokens": 8, "temperature": 0}
        before = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
        shutil.rmtree(model)
        after = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
        assert after["choices"][0]["text"] == before["choices"][0]["text"]
        chat = httpx.post(url + "/v1/chat/completions", timeout=60,
                          json={"model": "model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert chat.status_code == 200
        assert httpx.post(url + "/api/show", json={"model": "model"}, timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_pool_larger_than_memory_is_one_clear_line(tiny_models, command):
    args = [command, "--model", tiny_models["dense"], "--device", "cpu", "--kv-cache-gb", "100000"]
    args += ["--port", "0"] if command == "serve" else ["--prompt", "hi", "--max-tokens", "2"]
    p = run(*args, check=False)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert "out of memory" in last and "KV pages" in last, p.stderr
