#!/usr/bin/env python3
"""The load test of issue 26, on the CPU backend with the default model, loopback only, bounded in time.

  .venv/bin/python tests/load/load_test.py --bin build/src/deltaflow [--clients 500] [--duration 300]

Phases, each checked:
 1. A greedy reference answer (content and logprobs).
 2. Slow clients: TTFT of a well-behaved streaming client alone, then while --slow-clients connections send
    a request head that never ends (each reconnects when the server's header deadline closes it): the
    loaded p99 must stay under 2x the unloaded p99.
 3. Warm-up: --warmup seconds of the full load below, then idle: the server's RSS then is the warm level.
 4. The load: --clients concurrent clients (official `openai` AsyncOpenAI) for --duration seconds, each
    looping over requests: 30% stream and disconnect after 1-4 chunks, 10% stream and read slowly, the rest
    streamed or whole chat and completions, prompts that share a system prompt (the prefix cache), seeded
    sampling or greedy, 4-48 tokens.
 5. After: the engine idle with no sequence, page or slot held but the prefix cache's, no HTTP request in
    flight, no error that was not the client's doing, RSS within 5% of the warm level, and the reference
    request answered exactly as in phase 1. Then SIGTERM: exit 0.
Prints one JSON summary as the last line; exits 1 when a check fails.
"""
import argparse
import asyncio
import json
import multiprocessing
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import httpx
import openai

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SYSTEM = ("You are a careful assistant. Answer briefly and precisely; when asked for code, give only the "
          "code. Prefer plain words.")
TOPICS = ["sorting a list", "the weather", "prime numbers", "a haiku about rain", "HTTP keep-alive",
          "the capital of France", "binary search", "a short story", "unit tests", "the moon"]
REFERENCE = {"messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}],
             "max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 2}


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


class Server:
    def __init__(self, args):
        cmd = [args.bin, "serve", "--device", "cpu", "--port", "0", "--quiet", "--served-model-name", "m",
               "--max-queue", str(args.clients * 2), "--max-num-seqs", str(args.max_num_seqs),
               "--prefix-cache-gb", str(args.prefix_cache_gb)]
        if not args.slow_only:  # a binary from before --max-connections may be measured with --slow-only
            cmd += ["--max-connections", str(args.clients + args.slow_clients + 200)]
        if args.model:
            cmd += ["--model", args.model]
        env = dict(os.environ, DELTAFLOW_THREADS=os.environ.get("DELTAFLOW_THREADS", "2"))
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        self.log = []
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        else:
            raise RuntimeError("server did not start:\n" + "".join(self.log))
        threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stderr], daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.port
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server never became healthy:\n" + "".join(self.log))

    def metrics(self):
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(deltaflow_\w+) (\S+)$", text, re.M)}

    def wait_idle(self, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = self.metrics()
            if m["deltaflow_num_requests_running"] == 0 and m["deltaflow_num_requests_waiting"] == 0:
                return m
            time.sleep(0.2)
        return None

    def rss(self):
        return rss_kib(self.proc.pid)


def reference(url):
    c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    r = c.chat.completions.create(model="m", **REFERENCE)
    return {"content": r.choices[0].message.content,
            "logprobs": [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                         for t in r.choices[0].logprobs.content]}


async def ttft_once(client, i):
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Say hello number %d." % i}], max_tokens=2,
        temperature=0, stream=True)
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content is not None:
            first = time.perf_counter() - t0
    return first


async def slow_client(port):
    """Holds a connection with a request head that never ends; reconnects when the server closes it. It
    sleeps in a read (no timers), so that the holder itself takes no CPU from the server being measured."""
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Le")
            await writer.drain()
            while await reader.read(4096):
                pass
            writer.close()
        except OSError:
            await asyncio.sleep(0.1)


def hold_slow_clients(port, n, stop):
    async def run():
        tasks = [asyncio.create_task(slow_client(port)) for _ in range(n)]
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    asyncio.run(run())


async def slow_clients_phase(server, args):
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    await ttft_once(client, -1)
    unloaded = [await ttft_once(client, i) for i in range(args.ttft_samples)]
    # The slow clients live in a process of their own, so that their work does not delay this one's reads.
    stop = multiprocessing.Event()
    holder = multiprocessing.Process(target=hold_slow_clients, args=(server.port, args.slow_clients, stop))
    holder.start()
    await asyncio.sleep(3)
    held = server.metrics().get("deltaflow_http_connections")
    loaded = [await ttft_once(client, i) for i in range(args.ttft_samples)]
    stop.set()
    holder.join(30)
    await client.close()

    def p99(xs):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(0.99 * len(xs)))]
    return {"unloaded_ms": {"p50": 1e3 * statistics.median(unloaded), "p99": 1e3 * p99(unloaded)},
            "loaded_ms": {"p50": 1e3 * statistics.median(loaded), "p99": 1e3 * p99(loaded)},
            "connections_held": held}


class Tally:
    def __init__(self):
        self.counts = {}
        self.errors = []

    def add(self, kind):
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def error(self, what):
        self.add("error")
        if len(self.errors) < 20:
            self.errors.append(what)


async def one_client(i, url, deadline, tally, http):
    rng = random.Random(i)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300, http_client=http)
    while time.time() < deadline:
        roll = rng.random()
        topic = rng.choice(TOPICS)
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "Tell me about %s (%d)." % (topic, rng.randrange(1000))}]
        kw = dict(model="m", max_tokens=rng.randrange(4, 49))
        if rng.random() < 0.5:
            kw.update(temperature=0.8, seed=rng.randrange(1 << 30))
        else:
            kw.update(temperature=0)
        try:
            if roll < 0.3:  # disconnects mid-stream
                stream = await client.chat.completions.create(messages=messages, stream=True, **kw)
                n = rng.randrange(1, 5)
                async for _ in stream:
                    n -= 1
                    if n == 0:
                        break
                await stream.close()
                tally.add("disconnected")
            elif roll < 0.4:  # reads slowly
                stream = await client.chat.completions.create(messages=messages, stream=True, **kw)
                async for _ in stream:
                    await asyncio.sleep(rng.uniform(0.05, 0.3))
                tally.add("slow")
            elif roll < 0.7:
                stream = await client.chat.completions.create(messages=messages, stream=True,
                                                              stream_options={"include_usage": True}, **kw)
                finish = None
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                if finish not in ("stop", "length"):
                    tally.error("stream ended with finish_reason %r" % finish)
                else:
                    tally.add("streamed")
            elif roll < 0.85:
                r = await client.chat.completions.create(messages=messages, **kw)
                if r.choices[0].finish_reason not in ("stop", "length"):
                    tally.error("finish_reason %r" % r.choices[0].finish_reason)
                else:
                    tally.add("whole")
            else:
                r = await client.completions.create(prompt=SYSTEM + " " + topic, **kw)
                if r.choices[0].finish_reason not in ("stop", "length"):
                    tally.error("finish_reason %r" % r.choices[0].finish_reason)
                else:
                    tally.add("completion")
        except Exception as e:  # every exception here is the server's fault: the clients behave
            tally.error("%s: %s" % (type(e).__name__, str(e)[:200]))


async def load_phase(server, args, seconds, rss_samples):
    tally = Tally()
    deadline = time.time() + seconds
    limits = httpx.Limits(max_connections=args.clients + 50, max_keepalive_connections=args.clients + 50)
    async with httpx.AsyncClient(limits=limits, timeout=300) as http:
        async def sample():
            while time.time() < deadline:
                rss_samples.append(server.rss())
                await asyncio.sleep(1)
        sampler = asyncio.create_task(sample())
        await asyncio.gather(*[one_client(i, server.url, deadline, tally, http) for i in range(args.clients)])
        await sampler
    return tally


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "src", "deltaflow"))
    ap.add_argument("--model", default="", help="model directory (default: the built-in default model)")
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--warmup", type=float, default=30)
    ap.add_argument("--slow-clients", type=int, default=300)
    ap.add_argument("--ttft-samples", type=int, default=50)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    # Small enough that the warm-up fills it: past that, the cache's memory stays level (it evicts), and RSS
    # growth would be a leak rather than the cache filling its budget.
    ap.add_argument("--prefix-cache-gb", type=float, default=0.05)
    ap.add_argument("--slow-only", action="store_true",
                    help="only the slow-clients phase (e.g. to compare another build of the server)")
    args = ap.parse_args()

    server = Server(args)
    summary = {"clients": args.clients, "duration_s": args.duration}
    failures = []
    try:
        ref = reference(server.url)
        slow = asyncio.run(slow_clients_phase(server, args))
        summary["slow_clients"] = slow
        print("TTFT alone p50 %.1f / p99 %.1f ms; with %d slow clients p50 %.1f / p99 %.1f ms" % (
            slow["unloaded_ms"]["p50"], slow["unloaded_ms"]["p99"], args.slow_clients, slow["loaded_ms"]["p50"],
            slow["loaded_ms"]["p99"]), flush=True)
        if slow["loaded_ms"]["p99"] >= 2 * slow["unloaded_ms"]["p99"]:
            failures.append("TTFT p99 with slow clients is not under 2x its unloaded value")
        if args.slow_only:
            return finish(server, summary, failures)

        rss = []
        warm = asyncio.run(load_phase(server, args, args.warmup, rss))
        if not server.wait_idle():
            failures.append("not idle after the warm-up")
        time.sleep(2)
        rss_warm = server.rss()
        print("warm-up: %s; RSS %d MiB" % (warm.counts, rss_warm // 1024), flush=True)

        rss = []
        t0 = time.time()
        tally = asyncio.run(load_phase(server, args, args.duration, rss))
        elapsed = time.time() - t0
        after = server.wait_idle()
        time.sleep(2)
        rss_after = server.rss()
        summary.update(requests=tally.counts, errors=tally.errors, seconds=round(elapsed, 1),
                       rss_mib={"warm": rss_warm // 1024, "peak": max(rss) // 1024 if rss else None,
                                "after": rss_after // 1024})
        print("load: %s in %.0f s; RSS warm %d, peak %d, after %d MiB" % (
            tally.counts, elapsed, rss_warm // 1024, summary["rss_mib"]["peak"] or 0, rss_after // 1024), flush=True)
        if tally.errors:
            failures.append("%d errors, e.g. %s" % (tally.counts.get("error", 0), tally.errors[:3]))
        if after is None:
            failures.append("the engine did not go idle after the load")
        else:
            held = {"sequences": after["deltaflow_num_requests_running"] + after["deltaflow_num_requests_waiting"],
                    "pages_not_cache": after["deltaflow_kv_pages_used"] - after["deltaflow_kv_pages_cache_only"],
                    "slots_not_cache": after["deltaflow_state_slots_used"] - after["deltaflow_prefix_cache_checkpoints"],
                    "http_in_flight_besides_metrics": after["deltaflow_http_requests_in_flight"] - 1}
            summary["held_after"] = held
            if any(v != 0 for v in held.values()):
                failures.append("held after the load: %s" % held)
        if rss_after > 1.05 * rss_warm:
            failures.append("RSS after the load %d MiB is over 5%% above the warm level %d MiB" % (
                rss_after // 1024, rss_warm // 1024))
        again = reference(server.url)
        summary["reference_equal"] = again == ref
        if again != ref:
            failures.append("the reference request answers differently after the load")
    finally:
        if server.proc.poll() is None:
            finish(server, summary, failures)
    return 1 if failures else 0


def finish(server, summary, failures):
    server.proc.send_signal(signal.SIGTERM)
    try:
        rc = server.proc.wait(60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        rc = "hung on SIGTERM"
    summary["exit"] = rc
    if rc != 0:
        failures.append("serve exited %r on SIGTERM" % rc)
    summary["failures"] = failures
    print(json.dumps(summary))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
