"""`deltaflow batch`: OpenAI Batch JSONL in and out through the server's validation and the engine's
scheduler; error lines for bad lines and refused requests; duplicates refused before any work; --resume after
SIGKILL at random moments loses and duplicates nothing; a progress bar on a terminal, a summary at the end."""
import json
import os
import pty
import random
import signal
import subprocess
import time

import pytest

from conftest import BIN, run


def requests(n=40):
    out = []
    for i in range(n):
        if i % 2:
            body = {"model": "dense", "messages": [{"role": "user", "content": "Question %d?" % i}],
                    "max_tokens": 12, "temperature": 0, "ignore_eos": True, "enable_thinking": False}
            url = "/v1/chat/completions"
        else:
            body = {"model": "dense", "prompt": "Item %d:" % i, "max_tokens": 12, "temperature": 0,
                    "ignore_eos": True, "logprobs": 1}
            url = "/v1/completions"
        out.append({"custom_id": "req-%d" % i, "method": "POST", "url": url, "body": body})
    return out


def write_input(path, reqs, extra_lines=()):
    with open(path, "w") as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")


BAD_LINES = (
    "{not json",
    json.dumps({"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings", "body": {}}),
    json.dumps({"custom_id": "bad-field", "method": "POST", "url": "/v1/completions",
                "body": {"model": "dense", "prompt": "x", "temperature": 7}}),
    "",
)


def batch(model, inp, out, *extra, check=True):
    return run("batch", "--model", model, "--device", "cpu", "--input", inp, "--output", out, *extra, check=check)


def results(path):
    lines = open(path).read().splitlines()
    by_key = {}
    for line in lines:
        j = json.loads(line)
        key = j["custom_id"] if j["custom_id"] is not None else j["id"]
        assert key not in by_key, "duplicate result for " + key
        by_key[key] = j
    return by_key


def content(result):
    """What must not depend on the run: the choices and usage, or the error (ids and times do, and so does how
    much of a prompt the prefix cache served)."""
    if result["response"] is None:
        return ("error", result["error"])
    body = result["response"]["body"]
    if result["response"]["status_code"] != 200:
        return (result["response"]["status_code"], body["error"]["param"])
    usage = {k: v for k, v in body["usage"].items() if k != "prompt_tokens_details"}
    return (200, body["choices"], usage)


def test_batch_lines_and_errors(tiny_models, tmp_path):
    inp, out = str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl")
    write_input(inp, requests(6), BAD_LINES)
    p = batch(tiny_models["dense"], inp, out)
    assert "6 ok, 3 failed (2 bad lines)" in p.stderr and "results in " + out in p.stderr
    r = results(out)
    assert len(r) == 9
    ok = r["req-1"]
    assert ok["id"].startswith("batch_req_") and ok["error"] is None
    assert ok["response"]["status_code"] == 200 and ok["response"]["body"]["object"] == "chat.completion"
    assert r["req-0"]["response"]["body"]["object"] == "text_completion"
    assert r["req-0"]["response"]["body"]["usage"]["completion_tokens"] == 12
    assert r["batch_req_7"]["custom_id"] is None and "line 7: not valid JSON" in r["batch_req_7"]["error"]["message"]
    assert r["bad-url"]["response"] is None and "/v1/embeddings" in r["bad-url"]["error"]["message"]
    refused = r["bad-field"]["response"]
    assert refused["status_code"] == 400 and refused["body"]["error"]["param"] == "temperature"
    # The same answer as the server gives: a greedy chat request is deterministic.
    again = str(tmp_path / "again.jsonl")
    batch(tiny_models["dense"], inp, again)
    assert {k: content(v) for k, v in results(again).items()} == {k: content(v) for k, v in r.items()}


def test_duplicates_and_existing_output_are_errors_before_work(tiny_models, tmp_path):
    inp, out = str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl")
    reqs = requests(4)
    reqs[3]["custom_id"] = reqs[1]["custom_id"]
    write_input(inp, reqs)
    p = batch(tiny_models["dense"], inp, out, check=False)
    assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1
    assert "custom_id 'req-1' is used on line 2 and line 4" in p.stderr
    assert not os.path.exists(out)
    write_input(inp, requests(2))
    open(out, "w").close()
    p = batch(tiny_models["dense"], inp, out, check=False)
    assert p.returncode != 0 and "--resume" in p.stderr
    p = batch(tiny_models["dense"], "/nonexistent.jsonl", str(tmp_path / "x.jsonl"), check=False)
    assert p.returncode != 0 and "/nonexistent.jsonl: cannot open" in p.stderr


def test_sigkill_five_times_then_resume_equals_an_uninterrupted_run(tiny_models, tmp_path):
    inp = str(tmp_path / "in.jsonl")
    reqs = requests(60)
    write_input(inp, reqs, BAD_LINES)
    ref_path = str(tmp_path / "ref.jsonl")
    t0 = time.time()
    batch(tiny_models["dense"], inp, ref_path)
    full = time.time() - t0
    ref = results(ref_path)
    assert len(ref) == 63

    out = str(tmp_path / "out.jsonl")
    rng = random.Random(1234)
    kills = 0
    for _ in range(5):
        # Killed after a random number of new result lines (0: during start-up or the first request) plus a
        # random fraction of a request's time, so the kill lands anywhere, writes included.
        before = line_count(out)
        want = rng.randint(0, 6)
        proc = subprocess.Popen([BIN, "batch", "--model", tiny_models["dense"], "--device", "cpu", "--input", inp,
                                 "--output", out, "--resume"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while proc.poll() is None and line_count(out) < before + want:
            time.sleep(0.002)
        time.sleep(rng.uniform(0, full / 63))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        # A torn last line, as a kill in the middle of a write would leave.
        if os.path.exists(out) and rng.random() < 0.5:
            with open(out, "a") as f:
                f.write('{"id": "batch_req_9", "custom_id": "req-')
    assert kills == 5, "the job finished before it could be killed; make it longer"
    done_before = len(results_tolerant(out))
    p = batch(tiny_models["dense"], inp, out, "--resume")
    assert "resuming: %d of 63 requests already done" % done_before in p.stderr
    final = results(out)  # raises on a duplicate or a torn line
    assert sorted(final) == sorted(ref)
    for k in ref:
        assert content(final[k]) == content(ref[k]), k
    # Nothing left: a second resume does no work.
    p = batch(tiny_models["dense"], inp, out, "--resume")
    assert "0 requests: 0 ok, 0 failed" in p.stderr and open(out).read().count("\n") == 63


def line_count(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def results_tolerant(path):
    if not os.path.exists(path):
        return {}
    out = {}
    for line in open(path).read().split("\n"):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        out[j["custom_id"] or j["id"]] = j
    return out


def test_progress_bar_on_a_terminal(tiny_models, tmp_path):
    inp, out = str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl")
    write_input(inp, requests(8))
    master, slave = pty.openpty()
    p = subprocess.run([BIN, "batch", "--model", tiny_models["dense"], "--device", "cpu", "--input", inp, "--output",
                        out], stdout=subprocess.DEVNULL, stderr=slave, timeout=120)
    os.close(slave)
    text = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        text += chunk
    os.close(master)
    text = text.decode()
    assert p.returncode == 0
    assert "8/8 100%" in text and "ETA" in text and "req/s" in text
    assert "\r[" in text
    # Not on a pipe.
    p = batch(tiny_models["dense"], inp, str(tmp_path / "out2.jsonl"))
    assert "ETA" not in p.stderr and "8 ok" in p.stderr


def test_sigterm_stops_cleanly_then_resume_equals_an_uninterrupted_run(tiny_models, tmp_path):
    inp = str(tmp_path / "in.jsonl")
    reqs = requests(40)
    for r in reqs:
        r["body"]["max_tokens"] = 100  # long enough to be stopped in the middle
    write_input(inp, reqs)
    ref_path = str(tmp_path / "ref.jsonl")
    batch(tiny_models["dense"], inp, ref_path, "--max-queue", "2")
    ref = results(ref_path)

    out = str(tmp_path / "out.jsonl")
    for sig in (signal.SIGTERM, signal.SIGINT):
        before = line_count(out)
        proc = subprocess.Popen([BIN, "batch", "--model", tiny_models["dense"], "--device", "cpu", "--input", inp,
                                 "--output", out, "--resume", "--max-queue", "2"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        while proc.poll() is None and line_count(out) < before + 3:
            time.sleep(0.002)
        assert proc.poll() is None, "the job finished before it could be stopped"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err
        name = "SIGTERM" if sig == signal.SIGTERM else "SIGINT"
        assert ("stopped by %s: " % name) in err and "run again with --resume to finish" in err, err
        # Whole lines only: every line parses, no duplicates.
        assert open(out).read().endswith("\n")
        done = results(out)
        assert len(done) == line_count(out) and len(done) < 40
    p = batch(tiny_models["dense"], inp, out, "--resume")
    final = results(out)
    assert sorted(final) == sorted(ref)
    for k in ref:
        assert content(final[k]) == content(ref[k]), k
