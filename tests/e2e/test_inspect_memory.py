"""`deltaflow inspect DIR` prints the CUDA backend's memory plan (backend/memory_plan.cpp), on any machine."""
import os
import re

from conftest import FIXTURES, run

HOUSE = os.path.join(os.path.dirname(FIXTURES), "..", "models", "house")


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
    return out, fields


def test_house_model_plan_by_hand():
    # models/house: 8 layers, 2 full attention (2 kv heads x 128), 6 Gated DeltaNet (k 2 x 64, v 4 x 64, conv 4).
    out, f = plan()
    assert "memory plan:" in out and "4 sequences (+1 scratch slot) x 4096 positions" in out
    assert f["kv per token"] == 2 * 2 * 2 * 128 * 2  # layers x K,V x heads x dims x bf16
    assert f["kv cache"] == 5 * 4096 * 2048
    conv_dim = 2 * 2 * 64 + 4 * 64
    assert f["state per seq"] == 6 * (conv_dim * 3 + 4 * 64 * 64) * 4
    assert f["recurrent states"] == 5 * f["state per seq"]
    # The text tensors as stored, plus the norms widened to fp32 and 256-byte alignment.
    text_bytes = int(re.search(r"text bytes:\s+(\d+)", out).group(1))
    assert text_bytes <= f["weights"] <= text_bytes + 200_000
    assert f["total"] == f["weights"] + f["kv cache"] + f["recurrent states"] + f["workspace"]
    assert "fits" not in f


def test_flags_change_the_plan_and_fit():
    _, base = plan()
    _, f = plan("--max-sequences", 2, "--max-context", 1000, "--gpu-memory", 80)
    assert f["kv cache"] == 2 * ((3 * 1000 * 2048 // 2 + 255) // 256 * 256)
    assert f["recurrent states"] == 3 * base["state per seq"]
    assert f["fits"] == "yes"
    _, tiny = plan("--gpu-memory", 0.01)
    assert tiny["fits"] == "no"
    # How many sequences of the planned length the rest of the GPU holds, by hand.
    out, big = plan("--max-context", 4096, "--gpu-memory", 1)
    n = int(re.search(r"sequences that fit:\s+(\d+) sequences of 4096 positions", out).group(1))
    per_seq = big["kv per token"] * 4096 + big["state per seq"]
    assert n == (10**9 - big["weights"] - big["workspace"]) // per_seq
    assert re.search(r"sequences that fit:\s+0 sequences", run("inspect", HOUSE, "--gpu-memory", 0.01).stdout)
    _, exact = plan("--exact")
    assert exact["kv per token"] == 2 * base["kv per token"]


def test_bad_flags_are_errors():
    for flags in (("--max-sequences", 0), ("--max-context", 10**9), ("--gpu-memory", -1)):
        p = run("inspect", HOUSE, *flags, check=False)
        assert p.returncode != 0
        assert flags[0] in p.stderr
