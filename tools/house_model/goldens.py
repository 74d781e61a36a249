#!/usr/bin/env python3
"""Goldens for the house model, from transformers in fp32 (TF32 off), read only from the exported directory.

Writes OUT/fixtures/goldens.json:
  heldout   NLL of fixtures/heldout.txt: its token ids, and the total over non-overlapping windows (protocol below)
  greedy    10 fixed code prompts: prompt text, prompt ids, 32 greedy ids (EOS ignored), top-1 minus top-2 logit
            margin per step; from full forwards (no cache), cross-checked against cached decoding
  mtp       the MTP head (vLLM semantics, rebuilt from the shipped mtp.* tensors) on the same windows: t+2 NLL,
            top-1 accuracy, and its argmax ids for the first 64 positions
"""
import argparse
import hashlib
import os
import platform

import torch
from safetensors.torch import load_file

from common import HouseModel, log, score_windows, sha256_file, write_json

PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Stack:\n    \"\"\"A simple LIFO stack.\"\"\"\n\n    def __init__(self):\n",
    "    def __repr__(self):\n        return ",
    "for i in range(10):\n    if i % 2 == 0:\n",
    "def read_file(path):\n    with open(path",
    "try:\n    import json\nexcept ImportError:\n",
    "\"\"\"Utilities for parsing command-line arguments.\"\"\"\n\nimport argparse\n\n",
    "if __name__ == \"__main__\":\n",
    "def greet(name):\n    \"\"\"Return a greeting (Grüße, café).\"\"\"\n    return f\"",
]
NEW_TOKENS = 32

PROTOCOL = (
    "Tokenize the file's UTF-8 text with the model's tokenizer (no BOS, special-token strings parsed as usual). Split "
    "the ids into non-overlapping windows of `window` tokens from the start (the last window may be shorter). Score "
    "each window independently from its own start (fresh state, positions 0..n-1): a window of n tokens contributes "
    "n-1 scored positions, predicting ids 1..n-1 of the window. tokens = sum of (n-1); nll = sum of -log p in nats "
    "(fp32 log_softmax); ppl = exp(nll / tokens)."
)


@torch.no_grad()
def greedy(model, ids, n):
    """Full forward at every step (no cache): the plainest reference."""
    seq = list(ids)
    out, margins = [], []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([seq], device=model.device)).logits[0, -1].float()
        top = torch.topk(logits, 2)
        nxt = int(top.indices[0])
        margins.append(float(top.values[0] - top.values[1]))
        out.append(nxt)
        seq.append(nxt)
    return out, margins


@torch.no_grad()
def greedy_cached(model, ids, n):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    dev = model.device
    logits = model(input_ids=torch.tensor([ids], device=dev), past_key_values=cache, use_cache=True).logits[0, -1]
    out = []
    for _ in range(n):
        nxt = int(logits.argmax())
        out.append(nxt)
        logits = model(input_ids=torch.tensor([[nxt]], device=dev), past_key_values=cache,
                       use_cache=True).logits[0, -1]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--device", default="auto", help="auto = cuda if available (fp32, TF32 off), else cpu")
    args = ap.parse_args()
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM
    from tokenizers import Tokenizer

    model_dir = os.path.join(args.out, "model")
    fix_dir = os.path.join(args.out, "fixtures")
    text_path = os.path.join(fix_dir, "heldout.txt")
    with open(text_path, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8")
    torch.set_float32_matmul_precision("highest")  # true fp32 matmuls on CUDA (no TF32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(text, add_special_tokens=True)["input_ids"]
    raw_ids = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json")).encode(text).ids
    if ids != raw_ids:
        raise SystemExit("transformers and tokenizers disagree on heldout.txt")
    added = set(tok.get_added_vocab().values())

    model = Qwen3_5ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    house = HouseModel(model.config, lm=model)
    st = load_file(os.path.join(model_dir, "model.safetensors"))
    house.mtp.load_state_dict({k[len("mtp."):]: v.float() for k, v in st.items() if k.startswith("mtp.")})
    house.to(device).eval()

    r = score_windows(house, torch.tensor(ids), args.window, device)
    log(f"heldout: {len(ids)} ids, {r['tokens']} scored, nll {r['nll']:.4f}, ppl {r['ppl']:.4f}, "
        f"MTP t+2 top1 {r['mtp_top1_acc']:.4f}")
    first = torch.tensor(ids[: min(len(ids), args.window)], device=device)
    with torch.no_grad():
        h = model.model(input_ids=first[None]).last_hidden_state
        lp = torch.log_softmax(model.lm_head(h).float()[0, :-1], -1)
        first_lp = lp.gather(1, first[1:, None])[:, 0].tolist()
        k = min(64, first.numel() - 2)
        mtp_arg = house.mtp_from_hidden(h[:, :k], first[None, 1 : k + 1]).float()[0].argmax(-1).tolist()

    greedy_out = []
    for p in PROMPTS:
        pid = tok(p, add_special_tokens=True)["input_ids"]
        gen, margins = greedy(model, pid, NEW_TOKENS)
        cached = greedy_cached(model, pid, NEW_TOKENS)
        greedy_out.append({
            "prompt": p,
            "prompt_ids": pid,
            "generated_ids": gen,
            "generated_text": tok.decode(gen),
            "margins": [round(m, 6) for m in margins],
            "min_margin": round(min(margins), 6),
            "cached_decode_agrees": cached == gen,
        })
        log(f"greedy {p!r} -> {tok.decode(gen)!r} (min margin {min(margins):.3f}, "
            f"cached {'==' if cached == gen else '!='})")

    import transformers

    goldens = {
        "about": "transformers fp32 reference for models/house (tools/house_model/goldens.py)",
        "reference": {"torch": torch.__version__, "transformers": transformers.__version__,
                      "device": str(device), "dtype": "float32", "python": platform.python_version()},
        "model": {"config_sha256": sha256_file(os.path.join(model_dir, "config.json")),
                  "safetensors_sha256": sha256_file(os.path.join(model_dir, "model.safetensors")),
                  "tokenizer_sha256": sha256_file(os.path.join(model_dir, "tokenizer.json"))},
        "heldout": {
            "file": "heldout.txt",
            "bytes": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "protocol": PROTOCOL,
            "window": args.window,
            "n_ids": len(ids),
            "contains_added_tokens": any(i in added for i in ids),
            "tokens": r["tokens"],
            "nll": r["nll"],
            "nll_per_token": r["nll_per_token"],
            "ppl": r["ppl"],
            "top1_acc": r["top1_acc"],
            "windows": [{"start": w["start"], "tokens": w["tokens"], "nll": w["nll"]} for w in r["windows"]],
            "first_window_logprobs": [round(x, 6) for x in first_lp],
            "ids": ids,
        },
        "greedy": {
            "protocol": f"greedy argmax for {NEW_TOKENS} new tokens after the prompt's ids (no BOS); EOS ignored "
                        "(generation never stops early); fp32; each step a full forward of prompt + generated "
                        "ids (cached_decode_agrees: prefill + one-token cached decode steps gave the same ids)",
            "new_tokens": NEW_TOKENS,
            "cases": greedy_out,
        },
        "mtp": {
            "protocol": "same windows; at position i (i <= n-3) the MTP takes the post-norm final hidden state h_i "
                        "and embed(id_{i+1}) (e = norm(embed; pre_fc_norm_embedding), hn = norm(h_i; "
                        "pre_fc_norm_hidden), u = fc(cat[e, hn]), one full-attention layer over the window at "
                        "positions 0.., logits = lm_head(norm(u; mtp.norm))) and predicts id_{i+2}",
            "tokens": r["mtp_tokens"],
            "nll": r["mtp_nll"],
            "top1_acc": r["mtp_top1_acc"],
            "agree_with_main_argmax": r["mtp_agree_main_acc"],
            "first_window_argmax_ids": mtp_arg,
        },
    }
    write_json(os.path.join(fix_dir, "goldens.json"), goldens)
    log(f"goldens -> {os.path.join(fix_dir, 'goldens.json')}")
    print(f"GOLDENS heldout_ppl={r['ppl']:.4f} mtp_top1={r['mtp_top1_acc']:.4f} "
          f"min_margin={min(g['min_margin'] for g in greedy_out):.4f}", flush=True)
    if not all(g["cached_decode_agrees"] for g in greedy_out):
        log("warning: cached decoding disagreed with full forwards on some prompt (near-tie?)")


if __name__ == "__main__":
    main()
