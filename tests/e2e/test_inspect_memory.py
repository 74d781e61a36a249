"""`deltaflow inspect DIR` prints the CUDA backend's memory plan for the engine that serve's flags would start
(engine/pool_plan.cpp sizes the pools, backend/memory_plan.cpp the bytes), on any machine."""
import os
import shutil
import re

from conftest import FIXTURES, run

HOUSE = os.path.join(os.path.dirname(FIXTURES), "..", "models", "house")
GIB = 1 << 30


def plan(*flags, model=HOUSE):
    out = run("inspect", model, *flags).stdout
    fields = {}
    for line in out.splitlines():
        m = re.match(r"\s+([a-z ]+):\s+(\d+) bytes", line)
        if m:
            fields[m.group(1)] = int(m.group(2))
        m = re.match(r"\s+fits:\s+(yes|no)", line)
        if m:
            fields["fits"] = m.group(1)
        m = re.search(r"\((\d+) pages: (\d+) running, (\d+) prefix cache, 1 scratch\)", line)
        if m:
            fields["pages"], fields["running pages"], fields["cache pages"] = map(int, m.groups())
        m = re.search(r"\((\d+) slots: (\d+) running, (\d+) prefix-cache checkpoints, 1 scratch\)", line)
        if m:
            fields["slots"], fields["running slots"], fields["cache slots"] = map(int, m.groups())
    return out, fields


# models/house: 8 layers, 2 full attention (2 kv heads x 128), 6 Gated DeltaNet (k 2 x 64, v 4 x 64, conv 4);
# 4096 positions.
KV_TOKEN = 2 * 2 * 2 * 128 * 2  # layers x K,V x heads x dims x bf16
PAGE = 16 * KV_TOKEN
SLOT = 6 * ((2 * 2 * 64 + 4 * 64) * 3 + 4 * 64 * 64) * 4


def test_house_model_plan_by_hand():
    out, f = plan()
    assert "16 sequences of up to 4096 positions, bf16 KV pages of 16 positions" in out
    assert f["kv per token"] == KV_TOKEN
    assert f["state per seq"] == SLOT
    # Defaults: 16 sequences x 256 pages; the 1 GiB prefix cache, half pages, half slots (at most 16 a sequence).
    assert f["running pages"] == 16 * 256
    assert f["cache pages"] == GIB // 2 // PAGE
    assert f["pages"] == f["running pages"] + f["cache pages"] + 1
    assert f["kv cache"] == f["pages"] * PAGE
    assert "running pages hold: 16 sequences of 4096 positions at once" in out
    assert (f["running slots"], f["cache slots"]) == (16, min(GIB // 2 // SLOT, 16 * 16))
    assert f["recurrent states"] == f["slots"] * SLOT
    # The text tensors as stored, plus the norms widened to fp32 and 256-byte alignment.
    text_bytes = int(re.search(r"text bytes:\s+(\d+)", out).group(1))
    assert text_bytes <= f["weights"] <= text_bytes + 200_000
    assert f["total"] == f["weights"] + f["kv cache"] + f["recurrent states"] + f["workspace"]
    assert "fits" not in f


def test_serve_flags_change_the_plan():
    _, base = plan()
    _, f = plan("--max-num-seqs", 4, "--max-model-len", 1000, "--no-prefix-cache")
    assert (f["running pages"], f["cache pages"], f["pages"]) == (4 * 63, 0, 4 * 63 + 1)
    assert (f["running slots"], f["cache slots"], f["slots"]) == (4, 0, 5)
    # --kv-cache-gb sets the running pages whatever the sequences; fewer than they need is said.
    out, kv = plan("--kv-cache-gb", 0.05, "--prefix-cache-gb", 0)
    assert kv["running pages"] == int(0.05 * GIB) // PAGE
    assert f"running pages hold: {kv['running pages'] // 256} sequences of 4096 positions at once (--kv-cache-gb)" in out
    # Larger steps take a larger workspace.
    _, big_steps = plan("--max-num-batched-tokens", 16384)
    assert big_steps["workspace"] > base["workspace"]
    _, exact = plan("--exact")
    assert exact["kv per token"] == 2 * KV_TOKEN


def test_fp8_kv_pages():
    # E4M3 codes, a byte per element, and an fp32 scale per (position, kv head): 2 layers x K,V x 2 heads x
    # (128 + 4) bytes a token; as many running pages as bf16, in fewer bytes. The workspace gains the bf16
    # copy of a prefill's keys, one layer at a time: K and V of 4096 positions x 2 heads x 128 dims (in place
    # of bf16's 16-byte placeholder, one 256-byte piece).
    out, f = plan("--kv-cache-dtype", "fp8")
    _, bf16 = plan()
    assert "fp8 KV pages of 16 positions" in out
    assert f["kv per token"] == 2 * 2 * 2 * (128 + 4)
    assert f["running pages"] == bf16["running pages"]
    assert f["kv cache"] < bf16["kv cache"]
    assert f["workspace"] - bf16["workspace"] == 2 * 4096 * 2 * 128 * 2 - 256
    p = run("inspect", HOUSE, "--kv-cache-dtype", "fp4", check=False)
    assert p.returncode != 0 and "--kv-cache-dtype" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_gpu_memory_fits_and_sequences_that_fit():
    _, f = plan("--gpu-memory", 80)
    assert f["fits"] == "yes"
    assert plan("--gpu-memory", 0.01)[1]["fits"] == "no"
    # How many sequences of the planned length the rest of the GPU holds, by hand: what is left after the
    # weights, the workspace, the prefix cache's pages and slots and the scratch page and slot, in sequences
    # of 256 pages and a slot.
    out, g = plan("--gpu-memory", 1)
    m = re.search(r"sequences that fit:\s+(\d+) sequences of 4096 positions .*--max-num-seqs (\d+) --kv-cache-gb ([0-9.]+)", out)
    fixed = g["weights"] + g["workspace"] + (g["cache pages"] + 1) * PAGE + (g["cache slots"] + 1) * SLOT
    n = (10**9 - fixed) // (256 * PAGE + SLOT)
    assert int(m.group(1)) == int(m.group(2)) == n
    assert abs(float(m.group(3)) - n * 256 * PAGE / GIB) < 0.006
    assert re.search(r"sequences that fit:\s+0 sequences", run("inspect", HOUSE, "--gpu-memory", 0.01).stdout)


def test_bad_flags_are_errors():
    for flags in (("--max-num-seqs", 0), ("--max-model-len", 10**9), ("--gpu-memory", -1), ("--kv-cache-gb", -1),
                  ("--prefix-cache-gb", -1), ("--max-context", 100)):
        p = run("inspect", HOUSE, *flags, check=False)
        assert p.returncode != 0
        assert flags[0] in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


def test_config_only_plans_before_the_weights(tmp_path):
    """A folder with only config.json (Qwen3.6-27B's): the summary and the plan, counting bf16 weights."""
    shutil.copy(os.path.join(os.path.dirname(FIXTURES), "..", "bench", "configs", "qwen3.6-27b.json"),
                tmp_path / "config.json")
    out, f = plan("--max-model-len", 262144, "--max-num-seqs", 2, "--gpu-memory", 141, model=str(tmp_path))
    assert "config.json only" in out and "64 (48 linear_attention + 16 full_attention)" in out
    assert f["weights"] == 53786705920 + 10588416  # tests/unit/backend_memory_plan_test.cpp, by hand
    assert f["kv per token"] == 65536 and f["state per seq"] == 156893184
    assert "running pages hold: 1 sequence of 262144 positions at once" in out
    m = re.search(r"sequences that fit:\s+(\d+) sequences of 262144 positions", out)
    fixed = f["weights"] + f["workspace"] + (f["cache pages"] + 1) * (1 << 20) + (f["cache slots"] + 1) * 156893184
    assert int(m.group(1)) == (141 * 10**9 - fixed) // (16384 * (1 << 20) + 156893184) == 4


def test_config_only_quantized_27b_fits_a_32gb_gpu_at_32k():
    """nvidia/Qwen3.6-27B-NVFP4's config alone (bench/configs/qwen3.6-27b-nvfp4: MIXED_PRECISION): the plan
    counts NVFP4 and FP8 weights as the CUDA backend lays them out (tests/unit/backend_memory_plan_test.cpp
    works the bytes out by hand) and fits a 32 GB GPU with a 32K context; Qwen's FP8 block checkpoint does
    not."""
    configs = os.path.join(os.path.dirname(FIXTURES), "..", "bench", "configs")
    out, f = plan("--max-model-len", 32768, "--gpu-memory", 32, model=os.path.join(configs, "qwen3.6-27b-nvfp4"))
    assert "the quantization config's formats" in out and "MIXED_PRECISION" in out
    assert f["weights"] == 20171159808
    assert re.search(r"fits:\s+yes", out)
    m = re.search(r"sequences that fit:\s+(\d+) sequences of 32768 positions", out)
    assert int(m.group(1)) >= 1
    out, f = plan("--max-model-len", 32768, "--gpu-memory", 32, model=os.path.join(configs, "qwen3.6-27b-fp8"))
    assert f["weights"] == 29476270336
    assert re.search(r"fits:\s+no", out)
