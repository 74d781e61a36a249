"""The CLI's exact forms (issue 2 §8), driven as a user would, against the transformers goldens."""
import json
import re
import math
import os

import pytest

from conftest import FIXTURES, read_safetensors, run

PRESETS = ("dense", "moe", "tied", "multimodal", "next")


def golden(preset):
    return read_safetensors(os.path.join(FIXTURES, "model_goldens", f"{preset}.safetensors"))


@pytest.mark.parametrize("preset", PRESETS)
def test_generate_json_greedy_ids_equal_reference(tiny_models, preset):
    g = golden(preset)
    prompt = ",".join(map(str, g["greedy_prompt"][2]))
    p = run("generate", "--model", tiny_models[preset], "--prompt-ids", prompt, "--max-tokens", 32,
            "--ignore-eos", "--json")
    out = json.loads(p.stdout)
    assert out["ids"] == g["greedy_ids"][2]


@pytest.mark.parametrize("preset", ("dense", "next"))
def test_eval_json_logprobs_equal_reference(tiny_models, preset):
    g = golden(preset)
    ids = g["ids_64"][2]
    vocab = g["logits_64"][1][1]
    logits = g["logits_64"][2]
    p = run("eval", "--model", tiny_models[preset], "--ids", ",".join(map(str, ids)), "--json")
    out = json.loads(p.stdout)
    assert out["tokens"] == len(ids) - 1
    assert len(out["logprobs"]) == len(ids) - 1
    ref_nll = 0.0
    for i in range(len(ids) - 1):
        row = logits[i * vocab:(i + 1) * vocab]
        m = max(row)
        lse = m + math.log(sum(math.exp(x - m) for x in row))
        ref = row[ids[i + 1]] - lse
        ref_nll -= ref
        assert abs(out["logprobs"][i] - ref) < 1e-4, i
    assert abs(out["nll"] - ref_nll) < 1e-3 * max(1.0, ref_nll)
    assert abs(out["ppl"] - math.exp(ref_nll / (len(ids) - 1))) < 1e-3 * out["ppl"]


def test_generate_stops_at_eos_unless_ignored(tiny_models):
    # Sampled output may or may not hit EOS; either way it is at most max tokens and ends with eos if it stopped.
    p = run("generate", "--model", tiny_models["dense"], "--prompt-ids", "1,2,3", "--max-tokens", 5,
            "--temperature", "1.0", "--seed", "3", "--json")
    out = json.loads(p.stdout)
    assert 1 <= len(out["ids"]) <= 5
    assert out["finish_reason"] in ("stop", "length")
    # Same seed, same ids; the sampler is reproducible.
    again = json.loads(run("generate", "--model", tiny_models["dense"], "--prompt-ids", "1,2,3", "--max-tokens", 5,
                           "--temperature", "1.0", "--seed", "3", "--json").stdout)
    assert again == out


def test_inspect_reports_architecture_and_formats(tiny_models):
    out = run("inspect", tiny_models["multimodal"]).stdout
    assert "qwen3_5_moe" in out and "multimodal layout" in out
    assert "layer pattern:  LFLF" in out
    assert "vision tensors 2" in out
    assert re.search(r"mtp head:\s+\d+ parameters", out), out
    assert "format BF16" in out and "format F32" in out
    out = run("inspect", tiny_models["tied"]).stdout
    assert "tied" in out and "format F16" in out


@pytest.mark.parametrize("args,needle", [
    (["generate", "--model", "/nonexistent", "--prompt-ids", "1"], "/nonexistent/config.json: cannot open"),
    (["generate", "--prompt-ids", "1,x"], "'x' is not a token id"),
    (["generate", "--bogus"], "unknown flag --bogus"),
    (["generate", "--max-tokens"], "flag --max-tokens needs a value"),
    (["eval", "--ids", "5"], None),  # filled in below: needs the tiny model's path
    (["inspect"], "missing DIR"),
    (["make-tiny", "--preset", "nope", "--out", "/tmp/x"], "unknown preset 'nope'"),
    (["frobnicate"], "unknown command 'frobnicate'"),
])
def test_bad_arguments_exit_nonzero_with_one_line(args, needle, tiny_models):
    if args[0] == "eval" and needle is None:
        args = ["eval", "--model", tiny_models["dense"], "--ids", "5"]
        needle = "at least 2 ids"
    p = run(*args, check=False)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert needle in lines[0], lines[0]


def test_out_of_vocab_id_is_an_error(tiny_models):
    p = run("generate", "--model", tiny_models["dense"], "--prompt-ids", "1,5000", check=False)
    assert p.returncode != 0
    assert "token id 5000 is outside the vocabulary [0, 1024)" in p.stderr


def test_bad_checkpoint_is_one_line(tiny_models, tmp_path):
    d = tmp_path / "broken"
    run("make-tiny", "--preset", "dense", "--seed", 2, "--out", d)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    p = run("inspect", d, check=False)
    assert p.returncode != 0
    assert len(p.stderr.strip().splitlines()) == 1
    assert "model.safetensors" in p.stderr


def test_tensor_parallel_flag_errors_are_one_line(tiny_models):
    # --tensor-parallel-size: N > 1 on the CPU, more GPUs than are visible, and non-positive sizes (issue 7).
    cases = [
        (("--device", "cpu", "--tensor-parallel-size", "2"), "needs --device cuda"),
        (("--tensor-parallel-size", "1024"), "visible"),
        (("--tensor-parallel-size", "0"), "positive integer"),
    ]
    for extra, want in cases:
        for cmd in (("generate", "--prompt-ids", "1,2,3"), ("eval", "--ids", "1,2,3")):
            p = run(*cmd, "--model", tiny_models["dense"], *extra, check=False)
            assert p.returncode != 0, (cmd, extra)
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1 and want in lines[0] and "--tensor-parallel-size" in lines[0], p.stderr
    p = run("serve", "--model", tiny_models["dense"], "--device", "cpu", "--tensor-parallel-size", "2", check=False)
    assert p.returncode != 0 and "needs --device cuda" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_tensor_parallel_size_one_on_cpu_runs(tiny_models):
    p = run("generate", "--model", tiny_models["dense"], "--prompt-ids", "1,2,3", "--max-tokens", 3, "--device", "cpu",
            "--tensor-parallel-size", "1", "--json")
    assert len(json.loads(p.stdout)["ids"]) == 3
