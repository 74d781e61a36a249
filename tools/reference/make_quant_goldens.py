#!/usr/bin/env python3
"""Quantized tiny checkpoints and their goldens, made with the real producers (CPU, PyPI wheels):

  torch, transformers==5.17.0, nvidia-modelopt==0.47.0, llmcompressor==0.14.0.1 (compressed-tensors 0.19)

For each case below, the tiny model that `deltaflow make-tiny --preset P --seed 1` wrote (bf16) is loaded with
transformers, quantized by the producer and exported in its published layout:

  modelopt_nvfp4_dense    ModelOpt NVFP4_DEFAULT_CFG (W4A4: weight_scale_2 and input_scale), export_hf_checkpoint
  modelopt_w4a16_moe      ModelOpt W4A16_NVFP4_CFG on the MoE preset
  modelopt_mixed_dense    ModelOpt MIXED_PRECISION like nvidia/Qwen3.6-27B-NVFP4: W4A16 NVFP4 MLP and lm_head,
                          FP8 per-tensor attention projections, the rest bf16
  ct_nvfp4a16_dense       llm-compressor oneshot NVFP4A16 (nvfp4-pack-quantized, weight_global_scale)
  ct_fp8block_moe         llm-compressor oneshot FP8_BLOCK (float-quantized, 128x128 block scales)
  ct_fp8dynamic_dense     llm-compressor oneshot FP8_DYNAMIC (float-quantized, per-channel scales)
  qwen_fp8_dense          Qwen's `quant_method: fp8` block-128 layout (weight_scale_inv BF16) written here, read
                          back through transformers' own FP8 dequantization

Then every quantized tensor is dequantized to fp32 (e2m1 * (block scale * weight_scale_2) for ModelOpt,
e2m1 * (block scale / weight_global_scale) for compressed-tensors, e4m3 * scale for FP8) and checked
bit-for-bit against the producer's own dequantizer (NVFP4QTensor / FP8QTensor.dequantize, compressed-tensors
dequantize); transformers runs the fp32 model (activations fp32: weight-only semantics, as our CPU reference)
and gives the goldens:

  <case>/                  the quantized checkpoint as exported (config.json, hf_quant_config.json, model.safetensors)
  <case>.safetensors       ids_{n} I32 [n], logits_{n} F32 [n, V] for n in 1, 9, 40

Usage: python3 make_quant_goldens.py --models TINY_DIR --out tests/fixtures/quant
  where TINY_DIR/dense and TINY_DIR/moe are `deltaflow make-tiny` outputs (seed 1).

  python3 make_quant_goldens.py --models - --out tests/fixtures/quant --cases modelopt_mixed_dense --a8
  writes modelopt_mixed_dense_a8.safetensors from the checkpoint already there: the same ids, logits with the
  FP8 attention projections' inputs fake-quantized by ModelOpt's fp8_eager at their input_scale (the golden of
  `--emulate-activation-quant`).
"""
import argparse
import copy
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file

SEQ_LENGTHS = (1, 9, 40)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def fixed_ids(n, vocab, salt):
    x = (12345 + 7919 * salt + n) & 0xFFFFFFFF
    out = []
    for _ in range(n):
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        out.append(x % vocab)
    return out


def model_class(config):
    import transformers
    if config["model_type"] in ("qwen3_5", "qwen3_5_text"):
        return transformers.Qwen3_5ForCausalLM
    return transformers.Qwen3_5MoeForCausalLM


def load_bf16(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    model = model_class(config).from_pretrained(model_dir, dtype=torch.bfloat16)
    model.eval()
    return model


def calib_ids(vocab):
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (1, 48), generator=g) for _ in range(4)]


def calibrate(model):
    with torch.no_grad():
        for ids in calib_ids(model.config.vocab_size):
            model(input_ids=ids, use_cache=False)


# ---------------------------------------------------------------------------------------------------------
# Producers


def mixed_cfg():
    """nvidia's Qwen3.6 NVFP4 recipe: attention projections FP8 W8A8, MLP W4A16, lm_head W4A16."""
    import modelopt.torch.quantization as mtq
    cfg = copy.deepcopy(mtq.W4A16_NVFP4_CFG)
    fp8 = {"num_bits": [4, 3], "axis": None}
    nvfp4_w = {"num_bits": [2, 1], "block_sizes": {-1: 16, "type": "dynamic", "scale_bits": [4, 3]}}
    qc = cfg["quant_cfg"]
    for pat in ("*self_attn.*_proj*", "*linear_attn.in_proj_qkv*", "*linear_attn.in_proj_z*",
                "*linear_attn.out_proj*"):
        qc.append({"quantizer_name": pat.rstrip("*") + "*weight_quantizer", "cfg": fp8})
        qc.append({"quantizer_name": pat.rstrip("*") + "*input_quantizer", "cfg": fp8})
    qc.append({"quantizer_name": "*lm_head*weight_quantizer", "cfg": nvfp4_w, "enable": True})
    return cfg


def modelopt_export(src, out, cfg_name):
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    model = load_bf16(src)
    cfg = mixed_cfg() if cfg_name == "MIXED" else getattr(mtq, cfg_name)
    mtq.quantize(model, cfg, calibrate)
    export_hf_checkpoint(model, export_dir=out)


def llmcompressor_export(src, out, scheme):
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    model = load_bf16(src)
    ignore = ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$", "re:.*in_proj_[ab]$"]
    recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore)
    oneshot(model=model, recipe=recipe)
    model.save_pretrained(out, save_compressed=True)


def qwen_fp8_export(src, out):
    """Qwen's FP8 layout (Qwen/Qwen3.6-*-FP8): E4M3 weight, weight_scale_inv = blk_amax/448 per 128x128 block."""
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    # modules_to_not_convert, matched as transformers does (should_convert_module: a regex anchored at the start
    # of the module name, or a suffix); the same list `deltaflow quantize --format fp8-block` writes.
    from transformers.quantizers.quantizers_utils import should_convert_module
    keep = ["lm_head", "embed_tokens", "linear_attn.conv1d", "linear_attn.in_proj_a", "linear_attn.in_proj_b",
            "mlp.gate", "shared_expert_gate", "mtp"]
    tensors = {}
    with safe_open(os.path.join(src, "model.safetensors"), "pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            if not k.endswith(".weight") or t.dim() != 2 or not should_convert_module(k[: -len(".weight")], keep):
                tensors[k] = t
                continue
            w = t.float()
            n, kk = w.shape
            bn, bk = (n + 127) // 128, (kk + 127) // 128
            pad = torch.zeros(bn * 128, bk * 128)
            pad[:n, :kk] = w.abs()
            amax = pad.view(bn, 128, bk, 128).amax(dim=(1, 3))
            scale = (amax / 448.0).clamp(min=1e-12).to(torch.bfloat16)
            s_full = scale.float().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :kk]
            tensors[k] = (w / s_full).clamp(-448, 448).to(torch.float8_e4m3fn)
            tensors[k[: -len(".weight")] + ".weight_scale_inv"] = scale
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128], "modules_to_not_convert": keep}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


# ---------------------------------------------------------------------------------------------------------
# Dequantization: ours (the C++ reference's order of fp32 operations) and the producer's own


def nvfp4_ours(packed, scale, g, divide):
    n = packed.shape[0]
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(n, -1).long()
    vals = E2M1[codes]
    sb = scale.float()
    comb = sb / g.float() if divide else sb * g.float()
    return vals * comb.repeat_interleave(16, dim=1)


def fp8_ours(w, scale, n, k):
    s = scale.float()
    if s.numel() == 1:
        return w.float() * s.reshape(())
    if s.shape[0] == n and (s.dim() == 1 or s.shape[1] == 1):  # per channel
        return w.float() * s.reshape(-1, 1)
    if s.shape != (-(-n // 128), -(-k // 128)):
        raise SystemExit(f"unexpected block scale shape {tuple(s.shape)} for [{n}, {k}]")
    br, bc = 128, 128
    return w.float() * s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:n, :k]


def nvfp4_producer_modelopt(packed, scale, g):
    from modelopt.torch.quantization.qtensor import NVFP4QTensor
    n = packed.shape[0]
    q = NVFP4QTensor(torch.Size([n, packed.shape[1] * 2]), torch.float32, packed)
    return q.dequantize(dtype=torch.float32, scale=scale, double_scale=g, block_sizes={-1: 16})


def nvfp4_producer_ct(packed, scale, g):
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    n = packed.shape[0]
    x = unpack_fp4_from_uint8(packed, n, packed.shape[1] * 2, dtype=torch.float32)
    args = QuantizationArgs(num_bits=4, type="float", strategy="tensor_group", group_size=16)
    return dequantize(x_q=x, scale=scale.float(), args=args, global_scale=g.float(), dtype=torch.float32)


def fp8_producer(w, scale, convention):
    if convention == "modelopt":
        from modelopt.torch.quantization.qtensor import FP8QTensor
        q = FP8QTensor(w.shape, torch.float32, w)
        if scale.numel() == 1:
            return q.dequantize(dtype=torch.float32, scale=scale.float())
        return q.dequantize(dtype=torch.float32, scale=scale.float(), block_sizes={-1: 128, -2: 128})
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    n, k = w.shape
    s = scale.float()
    if s.numel() == 1:
        args = QuantizationArgs(num_bits=8, type="float", strategy="tensor")
    elif s.shape[0] == n and s.shape[-1] == 1:
        args = QuantizationArgs(num_bits=8, type="float", strategy="channel")
    else:
        args = QuantizationArgs(num_bits=8, type="float", strategy="block", block_structure=[128, 128])
    return dequantize(x_q=w.float(), scale=s, args=args, dtype=torch.float32)


def dequantize_checkpoint(qdir):
    """fp32 state dict of the quantized checkpoint; checks ours == the producer's, bit for bit."""
    with open(os.path.join(qdir, "config.json")) as f:
        config = json.load(f)
    method = config.get("quantization_config", {}).get("quant_method")
    raw = {}
    for name in sorted(os.listdir(qdir)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(qdir, name), "pt") as f:
                for k in f.keys():
                    raw[k] = f.get_tensor(k)
    out, stats = {}, {"nvfp4": 0, "fp8": 0, "float": 0, "max_ulp_diff": 0}
    skip_suffix = (".weight_scale", ".weight_scale_2", ".weight_global_scale", ".input_scale",
                   ".input_global_scale", ".weight_scale_inv", ".k_scale", ".v_scale")
    for k, t in raw.items():
        if k.endswith(skip_suffix):
            continue
        if k.endswith(".weight_packed") or (k.endswith(".weight") and t.dtype == torch.uint8):
            m = k.rsplit(".", 1)[0]
            if method == "compressed-tensors":
                g = raw[m + ".weight_global_scale"]
                ours = nvfp4_ours(t, raw[m + ".weight_scale"], g, True)
                theirs = nvfp4_producer_ct(t, raw[m + ".weight_scale"], g)
            else:
                g = raw[m + ".weight_scale_2"]
                ours = nvfp4_ours(t, raw[m + ".weight_scale"], g, False)
                theirs = nvfp4_producer_modelopt(t, raw[m + ".weight_scale"], g)
            stats["nvfp4"] += 1
        elif t.dtype == torch.float8_e4m3fn:
            m = k.rsplit(".", 1)[0]
            sname = m + (".weight_scale_inv" if method == "fp8" else ".weight_scale")
            ours = fp8_ours(t, raw[sname], *t.shape)
            theirs = None if method == "fp8" else fp8_producer(t, raw[sname], method)
            stats["fp8"] += 1
        else:
            out[k] = t.float()
            stats["float"] += 1
            continue
        if theirs is not None:
            # Equal as values (-0 == +0: ModelOpt's table has no -0), nothing NaN.
            theirs = theirs.float()
            if torch.isnan(ours).any() or not torch.equal(ours, theirs):
                diff = ours != theirs
                d = (ours[diff].view(torch.int32).long() - theirs[diff].view(torch.int32).long()).abs().max()
                stats["max_ulp_diff"] = max(stats["max_ulp_diff"], int(d))
        out[m + ".weight"] = ours.contiguous()
    return out, config, stats


def fp8_input_hooks(model, qdir):
    """Forward pre-hooks that fake-quantize the input of every FP8 module with a stored input_scale as ModelOpt's
    fake-quant model does (tensor_quant.fp8_eager, amax = input_scale * 448): the static W8A8 activations."""
    from modelopt.torch.quantization.tensor_quant import fp8_eager
    scales = {}
    with safe_open(os.path.join(qdir, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        for k in keys:
            m = k[: -len(".input_scale")]
            if k.endswith(".input_scale") and f.get_slice(m + ".weight").get_dtype() == "F8_E4M3":
                scales[m] = f.get_tensor(k).float()
    modules = dict(model.named_modules())
    handles = []
    for m, s in scales.items():
        name = m if m in modules else m.replace("model.language_model.", "model.")
        amax = s * 448.0
        handles.append(modules[name].register_forward_pre_hook(
            lambda mod, args, amax=amax: (fp8_eager(args[0], amax),) + tuple(args[1:])))
    return handles


def goldens_from_fp32(state, config, salt, qdir, fp8_via_transformers, a8=False):
    import transformers
    tmp = tempfile.mkdtemp()
    cfg = dict(config)
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(state, os.path.join(tmp, "model.safetensors"))
    cls = model_class(cfg)
    model, info = cls.from_pretrained(tmp, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "mismatched_keys", "error_msgs")}
    if bad:
        raise SystemExit(f"{qdir}: loading problems {bad}")
    unexpected = [k for k in info.get("unexpected_keys", []) if not k.startswith(("mtp.", "model.visual."))]
    if unexpected:
        raise SystemExit(f"{qdir}: unexpected keys {unexpected[:5]}")
    model.eval()
    if a8:
        fp8_input_hooks(model, qdir)
    ref = None
    if fp8_via_transformers:
        # transformers' own reader of Qwen's FP8 layout, dequantizing on the CPU: must give the same weights.
        ref = cls.from_pretrained(qdir, dtype=torch.float32,
                                  quantization_config=transformers.FineGrainedFP8Config(dequantize=True))
        ref.eval()
    vocab = model.config.vocab_size
    out = {}
    with torch.no_grad():
        for n in SEQ_LENGTHS:
            ids = fixed_ids(n, vocab, salt)
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().contiguous()
            if ref is not None:
                r = ref(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
                err = float((r - logits).abs().max())
                if err > 1e-4 * max(1.0, float(logits.abs().max())):
                    raise SystemExit(f"{qdir}: transformers' FP8 reader differs from our dequantization by {err}")
            out[f"ids_{n}"] = torch.tensor(ids, dtype=torch.int32)
            out[f"logits_{n}"] = logits
    shutil.rmtree(tmp)
    return out


CASES = {
    "modelopt_nvfp4_dense": ("dense", lambda s, o: modelopt_export(s, o, "NVFP4_DEFAULT_CFG")),
    "modelopt_w4a16_moe": ("moe", lambda s, o: modelopt_export(s, o, "W4A16_NVFP4_CFG")),
    "modelopt_mixed_dense": ("dense", lambda s, o: modelopt_export(s, o, "MIXED")),
    "ct_nvfp4a16_dense": ("dense", lambda s, o: llmcompressor_export(s, o, "NVFP4A16")),
    "ct_fp8block_moe": ("moe", lambda s, o: llmcompressor_export(s, o, "FP8_BLOCK")),
    "ct_fp8dynamic_dense": ("dense", lambda s, o: llmcompressor_export(s, o, "FP8_DYNAMIC")),
    "qwen_fp8_dense": ("dense", qwen_fp8_export),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--keep", action="store_true", help="keep cases already in --out")
    ap.add_argument("--a8", action="store_true",
                    help="only <case>_a8.safetensors of the exported cases in --out (modelopt_mixed_dense): the "
                         "same ids, the inputs of FP8 modules with an input_scale fake-quantized as ModelOpt's "
                         "fake-quant model does (deltaflow eval --emulate-activation-quant)")
    a = ap.parse_args()
    if a.a8:
        import transformers
        for case in a.cases.split(","):
            qdir = os.path.join(a.out, case)
            state, config, stats = dequantize_checkpoint(qdir)
            tensors = goldens_from_fp32(state, config, sum(map(ord, case)), qdir, False, a8=True)
            meta = {"case": case, "transformers": transformers.__version__, "torch": torch.__version__,
                    "dtype": "float32", "activations": "fp8 static (input_scale), modelopt fp8_eager",
                    "modelopt": __import__("modelopt").__version__}
            save_file(tensors, os.path.join(a.out, f"{case}_a8.safetensors"), metadata=meta)
            print(f"{case}_a8: {stats}", flush=True)
        return 0
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    for case in a.cases.split(","):
        preset, produce = CASES[case]
        qdir = os.path.join(a.out, case)
        shutil.rmtree(qdir, ignore_errors=True)
        produce(os.path.join(a.models, preset), qdir)
        for extra in os.listdir(qdir):  # generation_config.json, recipe.yaml, ...: not part of the fixture
            if extra not in ("config.json", "hf_quant_config.json", "model.safetensors"):
                os.remove(os.path.join(qdir, extra))
        state, config, stats = dequantize_checkpoint(qdir)
        if stats["max_ulp_diff"]:
            raise SystemExit(f"{case}: our dequantization differs from the producer's by {stats['max_ulp_diff']} ulp")
        salt = sum(map(ord, case))
        tensors = goldens_from_fp32(state, config, salt, qdir, case.startswith("qwen_fp8"))
        import transformers
        meta = {"case": case, "preset": preset, "transformers": transformers.__version__,
                "torch": torch.__version__, "dtype": "float32", "weights": json.dumps(stats)}
        for mod in ("modelopt", "llmcompressor", "compressed_tensors"):
            try:
                meta[mod] = __import__(mod).__version__
            except Exception:  # noqa: BLE001 - optional producer
                pass
        save_file(tensors, os.path.join(a.out, f"{case}.safetensors"), metadata=meta)
        print(f"{case}: {stats}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
