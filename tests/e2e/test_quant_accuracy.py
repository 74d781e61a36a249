"""`deltaflow quantize --method`, through the binary, on the house model: the searched (mse) and GPTQ
checkpoints keep the published layout and lose no more NLL against the BF16 original (`eval --reference`, a
short slice of the held-out text) than ModelOpt's exact recipe."""
import json
import os

import pytest

from conftest import FIXTURES, HELDOUT, HOUSE, eval_delta, run

CALIBRATION = os.path.join(FIXTURES, "house_model", "calibration.txt")


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    d = tmp_path_factory.mktemp("quant_accuracy")
    with open(HELDOUT) as f:
        heldout = f.read()
    with open(CALIBRATION) as f:
        calibration = f.read()
    short, calib = d / "short.txt", d / "calib.txt"
    short.write_text(heldout[:3000])  # 740 tokens
    calib.write_text(calibration[:12000])  # 3,500 tokens
    return {"dir": d, "short": short, "calib": calib}


def test_searched_and_gptq_nvfp4_lose_no_more_than_exact(texts):
    d = texts["dir"]
    deltas, tensors = {}, {}
    for method in ("exact", "mse", "gptq"):
        out = d / ("nvfp4-" + method)
        extra = ["--calibration", texts["calib"]] if method == "gptq" else []
        run("quantize", "--model", HOUSE, "--out", out, "--format", "nvfp4", "--method", method, *extra)
        deltas[method] = eval_delta(out, texts["short"])["delta_nll_per_token"]
        tensors[method] = read_layout(out / "model.safetensors")
    # The same published layout: every tensor's name, dtype and shape.
    assert tensors["mse"] == tensors["exact"] == tensors["gptq"]
    assert 0 < deltas["mse"] <= deltas["exact"], deltas
    assert 0 < deltas["gptq"] < deltas["exact"], deltas


def read_layout(path):
    """{name: (dtype, shape)} of a safetensors file (the header alone)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"}
