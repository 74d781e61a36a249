#!/usr/bin/env python3
"""Memory of `deltaflow serve` under load: rounds of concurrent clients (chat, streamed chat, completions,
bodies up to 256 KiB, a share of clients that disconnect mid-stream), the server's RSS sampled every 20 ms
(/proc/PID/status VmRSS). Prints per round the requests, seconds and peak RSS; the last line is one JSON
object. Used by tests/server/test_memory.py (the bound) and to compare allocators:

  python3 tools/load/load_memory.py --bin build/src/deltaflow --model DIR [--preload /usr/lib/.../libjemalloc.so.2]
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import threading
import time

import httpx


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def start(bin_path, model, preload, extra):
    env = dict(os.environ, DELTAFLOW_THREADS=os.environ.get("DELTAFLOW_THREADS", "2"))
    if preload:
        env["LD_PRELOAD"] = preload
    p = subprocess.Popen([bin_path, "serve", "--model", model, "--device", "cpu", "--port", "0", "--quiet",
                          "--served-model-name", "m"] + extra, stderr=subprocess.PIPE, text=True, env=env)
    for line in p.stderr:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            url = "http://127.0.0.1:%s" % m.group(1)
            break
    else:
        raise RuntimeError("server did not start")
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return p, url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError("server never became healthy")


def one(client, url, i):
    big = "word " * (50 + (i * 7919) % 2000)  # up to ~10 KB of text, ~2000 tokens at most
    if i % 10 == 9:
        big = "x" * (256 << 10)  # a 256 KiB body: refused as too long for the context (400), after parsing
    kind = i % 4
    body = {"model": "m", "max_tokens": 16 + i % 48, "temperature": 0.7, "seed": i, "ignore_eos": True}
    if kind == 0:
        body["prompt"] = big[:4000]
        return client.post(url + "/v1/completions", json=body).status_code
    body["messages"] = [{"role": "user", "content": big[:6000]}]
    if kind == 1:
        return client.post(url + "/v1/chat/completions", json=body).status_code
    body["stream"] = True
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for k, _ in enumerate(r.iter_lines()):
            if kind == 3 and k == 3:
                break  # the client goes away mid-stream
        return r.status_code


def round_(url, n, concurrency):
    local = threading.local()

    def run(i):
        if not hasattr(local, "c"):
            local.c = httpx.Client(timeout=300)
        return one(local.c, url, i)

    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(run, range(n)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--preload", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--server-args", default="", help="more serve flags, e.g. '--no-prefix-cache'")
    a = ap.parse_args()
    p, url = start(a.bin, a.model, a.preload, a.server_args.split())
    try:
        idle = rss_kib(p.pid)
        peaks, secs, statuses = [], [], {}
        for _ in range(a.rounds):
            peak = [0]
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], rss_kib(p.pid))
                    time.sleep(0.02)

            t = threading.Thread(target=sample)
            t.start()
            t0 = time.time()
            for s in round_(url, a.requests, a.concurrency):
                statuses[s] = statuses.get(s, 0) + 1
            secs.append(round(time.time() - t0, 2))
            stop.set()
            t.join()
            peaks.append(peak[0])
            print("round %d: %d requests in %.1fs, peak RSS %.1f MiB" % (len(peaks), a.requests, secs[-1],
                                                                        peak[0] / 1024), flush=True)
        after = rss_kib(p.pid)
        metrics = httpx.get(url + "/metrics").text
        cache = re.search(r"^deltaflow_prefix_cache_bytes (\S+)$", metrics, re.M)
        out = {"prefix_cache_bytes": float(cache.group(1)) if cache else None, "idle_kib": idle, "peak_kib": peaks, "after_kib": after, "seconds": secs,
               "statuses": {str(k): v for k, v in statuses.items()}, "preload": a.preload}
        print(json.dumps(out), flush=True)
    finally:
        p.terminate()
        p.wait(60)


if __name__ == "__main__":
    main()
