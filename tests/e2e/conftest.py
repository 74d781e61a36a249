import json
import os
import struct
import subprocess
import tempfile

import pytest

BIN = os.environ.get("DELTAFLOW_BIN", os.path.join(os.path.dirname(__file__), "../../build/src/deltaflow"))
FIXTURES = os.environ.get("DF_FIXTURES", os.path.join(os.path.dirname(__file__), "../fixtures"))
GOLDEN_SEED = 1


def run(*args, check=True):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"deltaflow {' '.join(map(str, args))} failed ({p.returncode}): {p.stderr}")
    return p


HOUSE = os.path.join(os.path.dirname(FIXTURES), "..", "models", "house")
HELDOUT = os.path.join(FIXTURES, "house_model", "heldout.txt")


def eval_delta(model, text, window=256):
    """`eval --reference` of `model` against the house model on `text`: the JSON, its delta checked."""
    out = json.loads(run("eval", "--model", model, "--reference", HOUSE, "--text", text, "--window", window,
                         "--device", "cpu", "--json").stdout)
    assert out["tokens"] == out["reference"]["tokens"]
    assert out["delta_nll_per_token"] == pytest.approx((out["nll"] - out["reference"]["nll"]) / out["tokens"])
    return out


def read_safetensors(path):
    """A minimal reader (the test needs no third-party package): {name: (dtype, shape, list of values)}."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    fmt = {"F32": "f", "I32": "i"}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        count = (end - b) // 4
        out[name] = (e["dtype"], e["shape"], list(struct.unpack(f"<{count}{fmt[e['dtype']]}", data[base + b:base + end])))
    return out


@pytest.fixture(scope="session")
def tiny_models():
    with tempfile.TemporaryDirectory(prefix="df_e2e_") as d:
        dirs = {}
        for preset in ("dense", "moe", "tied", "multimodal", "next"):
            dirs[preset] = os.path.join(d, preset)
            run("make-tiny", "--preset", preset, "--seed", GOLDEN_SEED, "--out", dirs[preset])
        yield dirs
