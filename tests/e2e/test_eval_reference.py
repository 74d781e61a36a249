"""`deltaflow eval --reference`, through the binary, on the house model over a short slice of its held-out
text: a model against itself differs by exactly 0; a missing or incompatible reference is a one-line error."""
import pytest

from conftest import HELDOUT, HOUSE, eval_delta, run


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval_reference")
    with open(HELDOUT) as f:
        heldout = f.read()
    short = d / "short.txt"
    short.write_text(heldout[:3000])  # 740 tokens
    return {"dir": d, "short": short}


def test_a_model_against_itself_differs_by_exactly_zero(texts):
    out = eval_delta(HOUSE, texts["short"])
    assert out["tokens"] > 700
    assert out["delta_nll_per_token"] == 0.0
    assert out["nll"] == out["reference"]["nll"] > 0
    text = run("eval", "--model", HOUSE, "--reference", HOUSE, "--text", texts["short"], "--window", 256,
               "--device", "cpu").stdout
    assert "delta nll per token (model - reference) +0.000000 nats" in text


def test_reference_errors_are_one_line(texts, tiny_models):
    for ref, needle in ((texts["dir"] / "missing", "no such directory"),
                        (texts["dir"], "not a model directory"),
                        (tiny_models["dense"], "a different tokenizer")):
        p = run("eval", "--model", HOUSE, "--reference", ref, "--text", texts["short"], "--window", 256,
                "--device", "cpu", check=False)
        assert p.returncode != 0
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], p.stderr
