"""`deltaflow inspect` on the producers' quantized exports and `deltaflow quantize`, through the binary."""
import os

from conftest import FIXTURES, run

QUANT = os.path.join(FIXTURES, "quant")


def test_inspect_shows_each_tensors_format_and_bytes_per_token():
    out = run("inspect", "--tensors", os.path.join(QUANT, "modelopt_mixed_dense")).stdout
    assert "quantization:   modelopt MIXED_PRECISION (modelopt 0.47.0)" in out
    lines = {l.split()[0]: l for l in out.splitlines() if l.startswith("  model.") or l.startswith("  lm_head")}
    assert "NVFP4 (E2M1, E4M3 g16 scales, x global)" in lines["model.layers.0.mlp.down_proj.weight"]
    assert "FP8 (E4M3, per-tensor F32 scales, static input scale)" in lines["model.layers.1.self_attn.q_proj.weight"]
    assert "BF16" in lines["model.layers.0.linear_attn.in_proj_a.weight"]
    assert "NVFP4" in lines["lm_head.weight"]
    assert "decode reads:" in out
    out = run("inspect", os.path.join(QUANT, "ct_nvfp4a16_dense")).stdout
    assert "compressed-tensors nvfp4-pack-quantized" in out
    assert "NVFP4 (E2M1, E4M3 g16 scales, / global)" in out


def test_quantize_writes_a_checkpoint_inspect_reads(tiny_models, tmp_path):
    for fmt, summary in (("nvfp4", "modelopt W4A16_NVFP4"), ("fp8-block", "fp8 block 128x128"),
                         ("nvfp4-mixed", "MIXED_PRECISION")):
        out = tmp_path / fmt
        run("quantize", "--model", tiny_models["moe"], "--out", out, "--format", fmt)
        assert (out / "tokenizer.json").exists()
        assert summary in run("inspect", out).stdout


def test_quantize_errors_are_one_line(tiny_models, tmp_path):
    bad_ids = tmp_path / "calib.json"
    bad_ids.write_text('{"ids": [[1, 2, 99999]]}')
    for args, needle in ((["--format", "int4"], "format 'int4' is not supported"),
                         (["--format", "nvfp4", "--calibration", bad_ids], "--calibration is for --format nvfp4-mixed"),
                         (["--format", "nvfp4-mixed", "--calibration", bad_ids], "outside the vocabulary"),
                         (["--format", "nvfp4-mixed", "--calibration", tmp_path / "missing.txt"],
                          "cannot read the calibration file"),
                         (["--format", "nvfp4", "--method", "awq"], "flag --method: 'awq' is not one of exact, mse, gptq"),
                         (["--format", "fp8-block", "--method", "gptq"], "--method gptq needs --calibration FILE")):
        p = run("quantize", "--model", tiny_models["dense"], "--out", tmp_path / "x", *args, check=False)
        assert p.returncode != 0
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], p.stderr
    p = run("quantize", "--model", os.path.join(QUANT, "qwen_fp8_dense"), "--out", tmp_path / "y", "--format",
            "nvfp4", check=False)
    assert p.returncode != 0 and "already quantized" in p.stderr
