#!/usr/bin/env python3
"""ModelOpt's own nvfp4-mixed figure on the house model (issue 21): held-out NLL delta of its fake-quant model.

Needs, in a venv of its own (not the repository's; not run in CI):
  pip install torch transformers==5.17.0 nvidia-modelopt==0.47.0      (CPU is enough)

What it does:
  1. loads models/house (bf16) with transformers' Qwen3_5ForCausalLM and quantizes it with ModelOpt's
     MIXED_PRECISION recipe as nvidia makes its Qwen3.6 NVFP4 checkpoints (the one make_quant_goldens.py uses for
     modelopt_mixed_dense): W4A16 NVFP4 MLP, FP8 per-tensor W8A8 attention projections (q/k/v/o, in_proj_qkv,
     in_proj_z, out_proj: static input scales), lm_head W4A16 NVFP4, the rest bf16; calibration: the windows
     `deltaflow quantize --calibration` uses (the calibration text in 512-token windows, 32 at most);
  2. scores the held-out text with the fake-quant model and the bf16 original in non-overlapping windows of
     --window tokens, the first token of each window unscored (what `deltaflow eval --window` does), in fp32 and
     in bf16, with these quantizer sets:
       full             everything the recipe enables (ModelOpt's figure)
       weight_only      input quantizers off (the FP8 activations of the attention projections kept in float)
       no_lm_head       lm_head's weight quantizer off (a tied lm_head: our export keeps it the bf16 embedding)
       weight_only_no_lm_head   both off: what our weight-only CPU reference runs
       act_only_attn    only the attention projections' input quantizers (weights float)
  3. exports the (full) model with export_hf_checkpoint to --export, with the house tokenizer files, for
     `deltaflow eval --model EXPORT --reference models/house` (--sets "" : export only).

ModelOpt 0.47's dynamic NVFP4 fake quant runs on CUDA only (Triton kernel or CUDA extension); with --device cpu
it is stood in by ModelOpt's own NVFP4QTensor quantize + dequantize (its export arithmetic). The figures of
docs/quantization.md ("ModelOpt's own figure") came from --device cpu --dtypes float32.

Token ids come from `deltaflow tokenize --json` (our tokenizer) so both sides score the same ids:
  deltaflow tokenize --model models/house --file tests/fixtures/house_model/heldout.txt --json > heldout.json
  deltaflow tokenize --model models/house --file tests/fixtures/house_model/calibration.txt --json > calib.json
  python modelopt_house_figure.py --model models/house --heldout heldout.json --calib calib.json --export DIR
"""
import argparse
import copy
import json
import os
import shutil

import torch

from make_quant_goldens import mixed_cfg  # the same MIXED recipe as the goldens (this folder)


def score(model, ids, window, dtype, device):
    model = model.to(device=device, dtype=dtype)
    nll, tokens = 0.0, 0
    with torch.no_grad():
        for b in range(0, len(ids), window):
            w = ids[b:b + window]
            if len(w) < 2:
                break
            x = torch.tensor([w], device=device)
            logits = model(input_ids=x, use_cache=False).logits[0].float()
            lp = torch.log_softmax(logits[:-1], dim=-1)
            nll -= float(lp.double().gather(1, x[0, 1:, None]).sum())
            tokens += len(w) - 1
    return nll, tokens


def cpu_nvfp4_fake_quant(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits):
    """ModelOpt 0.47's dynamic NVFP4 fake quant needs CUDA (a Triton kernel or its CUDA extension): on the CPU
    we stand in its own NVFP4QTensor quantize + dequantize (the arithmetic of its export, which `deltaflow
    quantize` matches bit for bit) with the quantizer's amax as the global amax."""
    from modelopt.torch.quantization.qtensor import NVFP4QTensor
    assert (num_bits, exponent_bits, scale_num_bits, scale_exponent_bits) == (4, 2, 8, 4), "NVFP4 only"
    s2 = amax.float().amax() / (6.0 * 448.0)
    q, sb, s2 = NVFP4QTensor.quantize(inputs, block_size, weights_scaling_factor_2=s2)
    return q.dequantize(dtype=inputs.dtype, scale=sb, double_scale=s2, block_sizes={-1: block_size})


def quantizer_sets(model):
    from modelopt.torch.quantization.nn import TensorQuantizer
    qs = {n: m for n, m in model.named_modules() if isinstance(m, TensorQuantizer)}
    enabled = {n for n, m in qs.items() if m.is_enabled}
    return qs, enabled


def apply_set(qs, enabled, name):
    attn = ("self_attn.", "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj")
    for n, m in qs.items():
        on = n in enabled
        if name in ("weight_only", "weight_only_no_lm_head") and n.endswith("input_quantizer"):
            on = False
        if name in ("no_lm_head", "weight_only_no_lm_head") and "lm_head" in n:
            on = False
        if name == "act_only_attn":
            on = on and n.endswith("input_quantizer") and any(a in n for a in attn)
        if on:
            m.enable()
        else:
            m.disable()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/house")
    ap.add_argument("--heldout", required=True, help="deltaflow tokenize --json of the held-out text")
    ap.add_argument("--calib", required=True, help="deltaflow tokenize --json of the calibration text")
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--export", help="write ModelOpt's export here")
    ap.add_argument("--sets", default="full,weight_only,no_lm_head,weight_only_no_lm_head,act_only_attn")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="ModelOpt 0.47's NVFP4 fake quant (dynamic block quant) runs on CUDA only")
    a = ap.parse_args()
    import modelopt
    import modelopt.torch.quantization as mtq
    import transformers
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (the conv taps go through cuDNN)
    torch.backends.cudnn.allow_tf32 = False
    ids = json.load(open(a.heldout))["ids"]
    cids = json.load(open(a.calib))["ids"]
    calib = [cids[i:i + 512] for i in range(0, len(cids), 512)][:32]
    print(json.dumps({"device": a.device, "torch": torch.__version__, "transformers": transformers.__version__,
                      "modelopt": modelopt.__version__, "heldout_ids": len(ids), "calib_windows": len(calib),
                      "calib_ids": sum(map(len, calib))}), flush=True)

    ref = Qwen3_5ForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).eval()
    refs = {}
    for dt in a.dtypes.split(",") if a.sets else ():
        refs[dt] = score(copy.deepcopy(ref), ids, a.window, getattr(torch, dt), a.device)
        print(json.dumps({"model": "bf16 original", "dtype": dt, "nll": refs[dt][0], "tokens": refs[dt][1]}),
              flush=True)

    model = Qwen3_5ForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).eval().to(a.device)

    def forward_loop(m):
        with torch.no_grad():
            for w in calib:
                m(input_ids=torch.tensor([w], device=a.device), use_cache=False)

    if a.device == "cpu":
        import modelopt.torch.quantization.tensor_quant as tq
        tq.dynamic_block_quantize_op = cpu_nvfp4_fake_quant
    mtq.quantize(model, mixed_cfg(), forward_loop)
    qs, enabled = quantizer_sets(model)
    print(json.dumps({"enabled_quantizers": len(enabled),
                      "lm_head": sorted(n for n in enabled if "lm_head" in n),
                      "tied": model.lm_head.weight is model.model.embed_tokens.weight}), flush=True)
    for name in filter(None, a.sets.split(",")):
        for dt in a.dtypes.split(","):
            m = copy.deepcopy(model)
            q2, _ = quantizer_sets(m)
            apply_set(q2, enabled, name)
            nll, tokens = score(m, ids, a.window, getattr(torch, dt), a.device)
            assert tokens == refs[dt][1]
            print(json.dumps({"set": name, "dtype": dt, "nll": nll, "tokens": tokens,
                              "delta_nll_per_token": (nll - refs[dt][0]) / tokens}), flush=True)
    if a.export:
        from modelopt.torch.export import export_hf_checkpoint
        shutil.rmtree(a.export, ignore_errors=True)
        apply_set(qs, enabled, "full")
        model = model.to(dtype=torch.bfloat16)
        model.config.architectures = model.config.architectures or [type(model).__name__]
        export_hf_checkpoint(model, export_dir=a.export)
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if os.path.exists(os.path.join(a.model, f)):
                shutil.copy(os.path.join(a.model, f), a.export)
        print(json.dumps({"exported": a.export, "files": sorted(os.listdir(a.export))}), flush=True)


if __name__ == "__main__":
    main()
