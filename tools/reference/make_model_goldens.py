#!/usr/bin/env python3
"""Goldens for the model tests, from Hugging Face transformers (5.17 on the GPU machine).

Loads each tiny checkpoint that `deltaflow make-tiny` wrote with the transformers class for its architecture, in
fp32 on the exact torch path (no fla / causal_conv1d installed there, so torch_chunk_gated_delta_rule,
torch_recurrent_gated_delta_rule and the torch causal conv run), and writes one safetensors file per preset:

  ids_{n}            I32 [n]       fixed id sequences, n in 1, 7, 64, 130 (130 crosses the 64-token chunk)
  logits_{n}         F32 [n, V]    logits of every position of ids_n (one full forward, no cache)
  hidden_7           F32 [L+1, 7, H]  embedding output and the output of every decoder layer for ids_7
  conv_state_{i}     F32 [conv_dim, K]  final conv state of linear layer i (global index) after ids_130 with cache
  gdn_state_{i}      F32 [nv, dk, dv]   final Gated DeltaNet state of linear layer i after ids_130
  greedy_prompt      I32 [7]       = ids_7
  greedy_ids         I32 [32]      32 greedy tokens (prefill + cached one-token decode steps, EOS ignored)
  greedy_margin      F32 [32]      top-1 minus top-2 logit at each greedy step

Usage: python3 make_model_goldens.py --models DIR --out DIR [--presets dense,moe,...]
  where DIR/<preset> are checkpoint directories.
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

SEQ_LENGTHS = (1, 7, 64, 130)
GREEDY_TOKENS = 32


def fixed_ids(n, vocab, salt):
    # A small LCG so that the C++ side could regenerate them; they are stored anyway.
    x = (12345 + 7919 * salt + n) & 0xFFFFFFFF
    out = []
    for _ in range(n):
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        out.append(x % vocab)
    return out


def model_class(config):
    import transformers
    mt = config["model_type"]
    if mt in ("qwen3_5", "qwen3_5_text"):
        return transformers.Qwen3_5ForCausalLM
    if mt in ("qwen3_5_moe", "qwen3_5_moe_text"):
        return transformers.Qwen3_5MoeForCausalLM
    if mt == "qwen3_next":
        return transformers.Qwen3NextForCausalLM
    raise SystemExit(f"unknown model_type {mt}")


def layer_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def goldens_for(model_dir):
    import transformers
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    cls = model_class(config)
    model, info = cls.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    model.eval()
    # Every weight must come from the file: a missing key would be silently random-initialised.
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "mismatched_keys", "error_msgs")}
    if bad:
        raise SystemExit(f"{model_dir}: loading problems {bad}")
    unexpected = [k for k in info.get("unexpected_keys", []) if not k.startswith(("mtp.", "model.visual."))]
    if unexpected:
        raise SystemExit(f"{model_dir}: unexpected keys {unexpected[:5]}")
    text = model.config
    vocab = text.vocab_size
    out = {}
    salt = sum(map(ord, os.path.basename(os.path.normpath(model_dir))))
    with torch.no_grad():
        for n in SEQ_LENGTHS:
            ids = fixed_ids(n, vocab, salt)
            t = torch.tensor([ids])
            logits = model(input_ids=t, use_cache=False).logits[0]
            out[f"ids_{n}"] = torch.tensor(ids, dtype=torch.int32)
            out[f"logits_{n}"] = logits.float().contiguous()

        # Hidden states of ids_7: hooks on the embedding and every decoder layer (pre final norm).
        captured = []
        hooks = [model.model.embed_tokens.register_forward_hook(lambda m, i, o: captured.append(layer_output(o)))]
        for layer in model.model.layers:
            hooks.append(layer.register_forward_hook(lambda m, i, o: captured.append(layer_output(o))))
        model(input_ids=torch.tensor([out["ids_7"].tolist()]), use_cache=False)
        for h in hooks:
            h.remove()
        out["hidden_7"] = torch.stack([c[0] for c in captured]).float().contiguous()

        # Final states after ids_130 through the cache.
        res = model(input_ids=torch.tensor([out["ids_130"].tolist()]), use_cache=True)
        cache = res.past_key_values
        for i, lt in enumerate(text.layer_types):
            if lt != "linear_attention":
                continue
            layer = cache.layers[i]
            out[f"conv_state_{i}"] = layer.conv_states[0][0].float().contiguous()
            out[f"gdn_state_{i}"] = layer.recurrent_states[0][0].float().contiguous()

        # Greedy: prefill the prompt, then one-token steps through the cache (the recurrent decode path).
        prompt = out["ids_7"].tolist()
        res = model(input_ids=torch.tensor([prompt]), use_cache=True)
        cache = res.past_key_values
        last = res.logits[0, -1]
        gen, margins = [], []
        for _ in range(GREEDY_TOKENS):
            top = torch.topk(last, 2)
            nxt = int(top.indices[0])
            gen.append(nxt)
            margins.append(float(top.values[0] - top.values[1]))
            res = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
            cache = res.past_key_values
            last = res.logits[0, -1]
        out["greedy_prompt"] = torch.tensor(prompt, dtype=torch.int32)
        out["greedy_ids"] = torch.tensor(gen, dtype=torch.int32)
        out["greedy_margin"] = torch.tensor(margins, dtype=torch.float32)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "class": cls.__name__,
            "device": "cpu", "dtype": "float32"}
    return out, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--presets", default="dense,moe,tied,multimodal,next,vl")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    for p in a.presets.split(","):
        tensors, meta = goldens_for(os.path.join(a.models, p))
        save_file(tensors, os.path.join(a.out, f"{p}.safetensors"), metadata=meta)
        m = tensors["greedy_margin"]
        print(f"{p}: {len(tensors)} tensors, greedy {tensors['greedy_ids'].tolist()[:8]}..., "
              f"min margin {float(m.min()):.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
