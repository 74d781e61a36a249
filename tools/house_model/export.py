#!/usr/bin/env python3
"""Export the trained house model as an HF checkpoint directory in the real Qwen3.5 multimodal layout, then verify it.

OUT/model/ gets:
  config.json             model_type qwen3_5, architectures [Qwen3_5ForConditionalGeneration], text_config (all text
                          fields, layer_types, rope_parameters, mtp_num_hidden_layers 1, eos), a placeholder
                          vision_config (no vision weights are shipped), tie_word_embeddings at both levels
  model.safetensors       bf16: model.language_model.* and mtp.* (no lm_head: tied)
  generation_config.json  eos [<|im_end|>, <|endoftext|>], pad, do_sample, enable_thinking false, temperature 0.6, top_k 20, top_p 0.95
  (tokenizer.json, tokenizer_config.json, chat_template.jinja are already there from train_tokenizer.py)

Verification (results in OUT/work/export_check.json; exit status 1 if a check fails):
  - Qwen3_5ForCausalLM.from_pretrained(OUT/model, output_loading_info=True): no missing keys, no unexpected keys
    other than mtp.*, no mismatched shapes;
  - its fp32 logits equal the trained model's (final.pt holds the bf16-rounded weights, so they must agree to
    float rounding), and the MTP rebuilt from the mtp.* tensors equals the trained MTP; the difference to the fp32
    master weights (logits, NLL on the check tokens) is reported;
  - the whole directory is at most --max-mb megabytes.
"""
import argparse
import os

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from common import HouseModel, log, make_text_config, read_json, sha256_file, write_json

VISION_PLACEHOLDER = {
    # A small, valid vision_config so multimodal-aware readers find the real layout. No model.visual.* tensors are
    # shipped: the house model is text-only.
    "model_type": "qwen3_5_vision",
    "depth": 1,
    "hidden_size": 64,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 128,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [],
    "initializer_range": 0.02,
}


def text_config_json(kw):
    rp = dict(kw["rope_parameters"])
    t = {
        "model_type": "qwen3_5_text",
        "architectures": None,
        "attention_bias": kw["attention_bias"],
        "attention_dropout": kw["attention_dropout"],
        "attn_output_gate": True,
        "dtype": "bfloat16",
        "eos_token_id": kw["eos_token_id"],
        "pad_token_id": kw["pad_token_id"],
        "bos_token_id": None,
        "full_attention_interval": 4,
        "head_dim": kw["head_dim"],
        "hidden_act": kw["hidden_act"],
        "hidden_size": kw["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": kw["intermediate_size"],
        "layer_types": kw["layer_types"],
        "linear_conv_kernel_dim": kw["linear_conv_kernel_dim"],
        "linear_key_head_dim": kw["linear_key_head_dim"],
        "linear_num_key_heads": kw["linear_num_key_heads"],
        "linear_num_value_heads": kw["linear_num_value_heads"],
        "linear_value_head_dim": kw["linear_value_head_dim"],
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": kw["max_position_embeddings"],
        "mlp_only_layers": [],
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": kw["num_attention_heads"],
        "num_hidden_layers": kw["num_hidden_layers"],
        "num_key_value_heads": kw["num_key_value_heads"],
        "partial_rotary_factor": rp["partial_rotary_factor"],
        "rms_norm_eps": kw["rms_norm_eps"],
        "rope_parameters": rp,
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": kw["vocab_size"],
    }
    del t["architectures"]
    return t


def export_tensors(state_dict):
    """Trainer names (lm.model.*, lm.lm_head.*, mtp.*) -> checkpoint names, bf16, contiguous."""
    out = {}
    for k, v in state_dict.items():
        if k.startswith("lm.model."):
            name = "model.language_model." + k[len("lm.model."):]
        elif k == "lm.lm_head.weight":
            continue  # tied to embed_tokens
        elif k.startswith("mtp."):
            name = k
        else:
            raise SystemExit(f"unexpected tensor {k}")
        out[name] = v.detach().to(torch.bfloat16).contiguous().clone()
    return dict(sorted(out.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-mb", type=float, default=60.0)
    ap.add_argument("--check-tokens", type=int, default=300)
    args = ap.parse_args()
    work = os.path.join(args.out, "work")
    model_dir = os.path.join(args.out, "model")
    final = torch.load(os.path.join(work, "final.pt"), map_location="cpu", weights_only=False)
    kw = final["text_config"]
    tok_cfg = read_json(os.path.join(model_dir, "tokenizer_config.json"))
    tid = {v["content"]: int(k) for k, v in tok_cfg["added_tokens_decoder"].items()}

    vision = dict(VISION_PLACEHOLDER, out_hidden_size=kw["hidden_size"])
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "image_token_id": tid["<|image_pad|>"],
        "video_token_id": tid["<|video_pad|>"],
        "vision_start_token_id": tid["<|vision_start|>"],
        "vision_end_token_id": tid["<|vision_end|>"],
        "tie_word_embeddings": True,
        "text_config": text_config_json(kw),
        "vision_config": vision,
        "transformers_version": __import__("transformers").__version__,
    }
    write_json(os.path.join(model_dir, "config.json"), config)
    gen = {
        "bos_token_id": tid["<|endoftext|>"],
        "do_sample": True,
        # Trained on Python only, never on conversations or thoughts: deltaflow serve reads this as the
        # chat default (thinking off) when a request does not say.
        "enable_thinking": False,
        "eos_token_id": [tid["<|im_end|>"], tid["<|endoftext|>"]],
        "pad_token_id": tid["<|endoftext|>"],
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": config["transformers_version"],
    }
    write_json(os.path.join(model_dir, "generation_config.json"), gen)
    tensors = export_tensors(final["state_dict"])
    st_path = os.path.join(model_dir, "model.safetensors")
    save_file(tensors, st_path, metadata={"format": "pt"})
    log(f"export: {len(tensors)} tensors -> {st_path} ({os.path.getsize(st_path) / 1e6:.2f} MB)")

    # --- verify ---
    from transformers import Qwen3_5ForCausalLM

    checks = {}
    torch.manual_seed(0)
    hf, info = Qwen3_5ForCausalLM.from_pretrained(model_dir, output_loading_info=True, dtype=torch.float32)
    hf.eval()
    missing = sorted(info.get("missing_keys", []))
    unexpected = sorted(info.get("unexpected_keys", []))
    mismatched = [str(x) for x in info.get("mismatched_keys", [])]
    checks["missing_keys"] = missing
    checks["unexpected_keys_not_mtp"] = [k for k in unexpected if not k.startswith("mtp.")]
    checks["mismatched_keys"] = mismatched
    checks["tied"] = hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    ok = not missing and not checks["unexpected_keys_not_mtp"] and not mismatched and checks["tied"]

    trained = HouseModel(make_text_config(kw))
    trained.load_state_dict(final["state_dict"])
    trained.eval()
    ids_path = os.path.join(work, "ids_test.npy")
    ids = torch.from_numpy(np.load(ids_path)[: args.check_tokens].astype(np.int64))[None]
    with torch.no_grad():
        a = trained.lm(input_ids=ids).logits
        b = hf(input_ids=ids).logits
        checks["logits_max_abs_diff"] = float((a - b).abs().max())
        # MTP rebuilt from the shipped mtp.* tensors only, on top of the HF-loaded trunk.
        loaded = load_file(st_path)
        rebuilt = HouseModel(hf.config, lm=hf)
        rebuilt.mtp.load_state_dict({k[len("mtp."):]: v.float() for k, v in loaded.items() if k.startswith("mtp.")})
        rebuilt.eval()
        h1 = trained.lm.model(input_ids=ids).last_hidden_state
        h2 = hf.model(input_ids=ids).last_hidden_state
        m1 = trained.mtp_from_hidden(h1[:, :-1], ids[:, 1:])
        m2 = rebuilt.mtp_from_hidden(h2[:, :-1], ids[:, 1:])
        checks["mtp_logits_max_abs_diff"] = float((m1 - m2).abs().max())
        checks["logits_scale"] = float(a.abs().max())
        if "state_dict_fp32" in final:
            # What bf16 storage costs against the fp32 master weights: informational, not a pass/fail check.
            master = HouseModel(make_text_config(kw))
            master.load_state_dict(final["state_dict_fp32"])
            master.eval()
            c = master.lm(input_ids=ids).logits
            tgt = ids[0, 1:]

            def nll(lg):
                return float(torch.nn.functional.cross_entropy(lg[0, :-1].float(), tgt))

            checks["fp32_master_vs_bf16_logits_max_abs_diff"] = float((c - b).abs().max())
            checks["fp32_master_nll"] = nll(c)
            checks["bf16_nll"] = nll(b)
    ok = ok and checks["logits_max_abs_diff"] <= 1e-3 and checks["mtp_logits_max_abs_diff"] <= 1e-3

    files = sorted(os.listdir(model_dir))
    total = sum(os.path.getsize(os.path.join(model_dir, f)) for f in files)
    checks["files"] = {f: os.path.getsize(os.path.join(model_dir, f)) for f in files}
    checks["total_bytes"] = total
    checks["size_ok"] = total <= args.max_mb * 1e6
    ok = ok and checks["size_ok"]
    checks["safetensors_sha256"] = sha256_file(st_path)
    checks["ok"] = ok
    write_json(os.path.join(work, "export_check.json"), checks)
    log(f"export check: missing {missing}, unexpected non-mtp {checks['unexpected_keys_not_mtp']}, "
        f"logits diff {checks['logits_max_abs_diff']:.2e}, mtp diff {checks['mtp_logits_max_abs_diff']:.2e}, "
        f"dir {total / 1e6:.2f} MB -> {'OK' if ok else 'FAILED'}")
    if "bf16_nll" in checks:
        log(f"bf16 storage vs fp32 master: logits max diff {checks['fp32_master_vs_bf16_logits_max_abs_diff']:.3e}, "
            f"check NLL {checks['fp32_master_nll']:.4f} -> {checks['bf16_nll']:.4f}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
