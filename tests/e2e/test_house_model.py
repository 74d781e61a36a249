"""The shipped default model (models/house) against its transformers goldens (tools/house_model/goldens.py):
held-out NLL within 0.5% through `deltaflow eval --text` with no --model (the default model), and the greedy
continuations of 10 prompts equal, id for id."""
import json
import os

import pytest

from conftest import FIXTURES, run

GOLDENS = os.path.join(FIXTURES, "house_model", "goldens.json")


@pytest.fixture(scope="module")
def goldens():
    with open(GOLDENS) as f:
        return json.load(f)


def test_default_model_heldout_nll_matches_reference(goldens):
    h = goldens["heldout"]
    text_file = os.path.join(FIXTURES, "house_model", h["file"])
    out = json.loads(run("eval", "--text", text_file, "--window", h["window"], "--json").stdout)
    assert out["tokens"] == h["tokens"]
    assert abs(out["nll"] - h["nll"]) <= 0.005 * h["nll"], (out["nll"], h["nll"])
    assert abs(out["ppl"] - h["ppl"]) <= 0.01 * h["ppl"]


def test_default_model_tokenizes_the_heldout_file_like_the_reference(goldens, tmp_path):
    h = goldens["heldout"]
    text_file = os.path.join(FIXTURES, "house_model", h["file"])
    ids = json.loads(run("tokenize", "--model", os.path.join(os.path.dirname(FIXTURES), "..", "models", "house"),
                         "--file", text_file, "--json").stdout)["ids"]
    assert ids == h["ids"]


def test_default_model_greedy_continuations_equal_reference(goldens):
    for case in goldens["greedy"]["cases"]:
        out = json.loads(run("generate", "--prompt-ids", ",".join(map(str, case["prompt_ids"])), "--max-tokens",
                             len(case["generated_ids"]), "--ignore-eos", "--json").stdout)
        assert out["ids"] == case["generated_ids"], case["prompt"]
