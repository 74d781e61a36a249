"""/metrics in the Prometheus text format, counting what was served; /health before and after loading."""
import re
import subprocess
import time

import httpx

from conftest import MODEL, deltaflow_bin


def parse(text):
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        assert m, "bad exposition line: %r" % line
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def test_metrics_count_requests_and_tokens(server):
    before = parse(server.get("/metrics").text)
    r = server.post("/v1/completions", {"model": MODEL, "prompt": "abc", "max_tokens": 7, "ignore_eos": True}).json()
    after = parse(server.get("/metrics").text)
    assert after["deltaflow_generation_tokens_total"] - before["deltaflow_generation_tokens_total"] == 7
    assert (after["deltaflow_prompt_tokens_total"] - before["deltaflow_prompt_tokens_total"] ==
            r["usage"]["prompt_tokens"])
    key = 'deltaflow_http_requests_total{route="/v1/completions",status="200"}'
    assert after[key] - before.get(key, 0) == 1
    for h in ("deltaflow_time_to_first_token_seconds", "deltaflow_time_per_output_token_seconds",
              "deltaflow_e2e_request_latency_seconds"):
        assert after[h + "_count"] >= before.get(h + "_count", 0) + 1
        assert after[h + '_bucket{le="+Inf"}'] == after[h + "_count"]
    assert after["deltaflow_num_requests_waiting"] == 0
    assert after["deltaflow_model_loaded"] == 1
    for g in ("deltaflow_kv_pages_used", "deltaflow_kv_pages_total", "deltaflow_state_slots_used",
              "deltaflow_state_slots_total", "deltaflow_prefix_cache_checkpoints", "deltaflow_num_preemptions_total",
              "deltaflow_prefix_cache_evictions_total"):
        assert g in after, g
    assert after["deltaflow_kv_pages_total"] > 0 and after["deltaflow_state_slots_total"] > 0


def test_prefix_cache_reuse_is_reported(server):
    # The same prompt twice: the second reuses all but its last token, in usage and in /metrics.
    prompt = "The prefix cache keeps the recurrent state of this exact prompt: " + "lorem ipsum " * 20
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 3, "temperature": 0}
    first = server.post("/v1/completions", body).json()
    before = parse(server.get("/metrics").text)
    second = server.post("/v1/completions", body).json()
    after = parse(server.get("/metrics").text)
    n = first["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1
    assert second["choices"][0]["text"] == first["choices"][0]["text"]
    assert (after["deltaflow_prefix_cache_hit_tokens_total"] - before["deltaflow_prefix_cache_hit_tokens_total"]
            == n - 1)


def test_health_is_503_while_loading(tmp_path, model_dir):
    # A model directory whose weights load slowly is hard to make; instead watch a fresh server from its very
    # first line: /health answers (503 or 200) as soon as the port is open, and 200 once loaded.
    proc = subprocess.Popen([deltaflow_bin(), "serve", "--model", model_dir, "--port", "0", "--quiet"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        port = int(re.search(r":(\d+) ", line).group(1))
        codes = []
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                c = httpx.get("http://127.0.0.1:%d/health" % port, timeout=5).status_code
            except httpx.HTTPError:
                continue
            codes.append(c)
            if c == 200:
                break
        assert codes[-1] == 200 and set(codes) <= {200, 503}
        # Without a key on loopback, everything is open.
        assert httpx.get("http://127.0.0.1:%d/v1/models" % port).status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
