#!/usr/bin/env python3
"""Fill models/house/README.md's {{PLACEHOLDERS}} from the run's outputs into OUT/model/README.md, write
OUT/summary.json, and print the run summary."""
import argparse
import datetime
import os
import re
import shutil
import sys

from common import read_json, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
# The template's one source; models/house/README.md starts as a copy and is replaced by the filled-in file.
TEMPLATE = os.path.join(HERE, "model_readme.template.md")


def fmt_int(n):
    return f"{n:,}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--phases", default="")
    args = ap.parse_args()
    out = args.out
    model_dir = os.path.join(out, "model")
    man = read_json(os.path.join(out, "data_manifest.json"))
    tr = read_json(os.path.join(out, "work", "train_summary.json"))
    ex = read_json(os.path.join(out, "work", "export_check.json"))
    gd = read_json(os.path.join(out, "fixtures", "goldens.json"))
    cfg = read_json(os.path.join(model_dir, "config.json"))
    tc = cfg["text_config"]
    tok = read_json(os.path.join(model_dir, "tokenizer_config.json"))
    tid = {v["content"]: int(k) for k, v in tok["added_tokens_decoder"].items()}
    import torch
    import transformers

    shutil.copyfile(os.path.join(out, "data_manifest.json"), os.path.join(model_dir, "data_manifest.json"))
    train_split = man["splits"]["train"]
    test_split = man["splits"]["test"]
    site = train_split.get("site")
    site_note = ""
    if site:
        site_note = (f", plus {site['files']} `*.py` files ({site['bytes'] / 1e6:.1f} MB) of its installed packages "
                     f"(`{man['roots'].get('site')}`, training only)")
    rot = int(tc["head_dim"] * tc["rope_parameters"]["partial_rotary_factor"])
    test = tr["test"]
    files = ex["files"]
    size_mb = (sum(files.values()) + 20000) / 1e6  # + README and manifest, roughly
    vals = {
        "LAYERS": tc["num_hidden_layers"],
        "LAYER_TYPES": "`" + " ".join("F" if t == "full_attention" else "L" for t in tc["layer_types"]) + "`",
        "HIDDEN": tc["hidden_size"], "HIDDEN2": 2 * tc["hidden_size"], "INTERMEDIATE": tc["intermediate_size"],
        "HEADS": tc["num_attention_heads"], "KV_HEADS": tc["num_key_value_heads"], "HEAD_DIM": tc["head_dim"],
        "ROTARY_DIM": rot, "MROPE": tc["rope_parameters"]["mrope_section"],
        "LIN_K_HEADS": tc["linear_num_key_heads"], "LIN_K_DIM": tc["linear_key_head_dim"],
        "LIN_V_HEADS": tc["linear_num_value_heads"], "LIN_V_DIM": tc["linear_value_head_dim"],
        "VOCAB": tc["vocab_size"], "SEQ_LEN": tr["seq_len"], "MAX_POS": tc["max_position_embeddings"],
        "PARAMS": fmt_int(tr["params"]), "PARAMS_MTP": fmt_int(tr["params_mtp"]), "SIZE_MB": f"{size_mb:.1f}",
        "LAST_BPE_ID": tid["<|endoftext|>"] - 1, "EOT_ID": tid["<|endoftext|>"], "IM_START_ID": tid["<|im_start|>"],
        "IM_END_ID": tid["<|im_end|>"], "THINK_ID": tid["<think>"], "THINK_END_ID": tid["</think>"],
        "PYTHON_VERSION": man["python_version"].split()[0], "STDLIB_PATH": man["roots"]["stdlib"],
        "SITE_NOTE": site_note,
        "TEST_FILES": test_split["stdlib"]["files"], "TEST_MB": f"{test_split['stdlib']['bytes'] / 1e6:.2f}",
        "TRAIN_FILES": sum(v["files"] for v in train_split.values()),
        "TRAIN_MB": f"{sum(v['bytes'] for v in train_split.values()) / 1e6:.1f}",
        "TRAIN_TOKENS": fmt_int(tr["train_tokens"]),
        "DEVICE": tr["device"], "PRECISION": tr.get("precision", "bf16 autocast with fp32 master weights"),
        "TRAIN_SECONDS": f"{tr['train_seconds']:.0f}", "STEPS": fmt_int(tr["steps"]),
        "BATCH_TOKENS": fmt_int(tr["batch_tokens"]), "TOKENS_SEEN": fmt_int(tr["tokens_seen"]),
        "EPOCHS": tr["epochs"], "TOKENS_PER_S": fmt_int(tr["tokens_per_second"] or 0),
        "WEIGHT_DECAY": tr["weight_decay"], "LR": tr["lr"], "GRAD_CLIP": tr["grad_clip"],
        "MTP_WEIGHT": tr["mtp_weight"], "SELECTED": tr["selected"], "SEED": tr["seed"],
        "TORCH": torch.__version__, "TRANSFORMERS": transformers.__version__,
        "TEST_TOKENS": fmt_int(test["tokens"]), "HELDOUT_PPL": f"{test['ppl']:.3f}",
        "HELDOUT_NLL": f"{test['nll_per_token']:.4f}", "TOP1": f"{test['top1_acc']:.3f}",
        "MTP_TOP1": f"{test['mtp_top1_acc']:.3f}", "MTP_AGREE": f"{test['mtp_agree_main_acc']:.3f}",
        "FIXTURE_BYTES": fmt_int(gd["heldout"]["bytes"]), "FIXTURE_TOKENS": fmt_int(gd["heldout"]["tokens"]),
        "GOLDEN_WINDOW": gd["heldout"]["window"], "FIXTURE_PPL": f"{gd['heldout']['ppl']:.3f}",
        "DATE": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    with open(TEMPLATE, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"\{\{([A-Z0-9_]+)\}\}", lambda m: str(vals.get(m.group(1), m.group(0))), text)
    left = re.findall(r"\{\{[A-Z0-9_]+\}\}", text)
    with open(os.path.join(model_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write(text)

    total = sum(os.path.getsize(os.path.join(model_dir, f)) for f in os.listdir(model_dir))
    phases = {}
    if args.phases and os.path.exists(args.phases):
        for line in open(args.phases):
            k, v = line.split()
            phases[k] = float(v)
    summary = {
        "heldout_ppl": test["ppl"], "heldout_nll_per_token": test["nll_per_token"], "heldout_tokens": test["tokens"],
        "top1_acc": test["top1_acc"], "mtp_top1_acc": test["mtp_top1_acc"],
        "mtp_agree_main_acc": test["mtp_agree_main_acc"],
        "fixture_ppl": gd["heldout"]["ppl"], "fixture_tokens": gd["heldout"]["tokens"],
        "greedy_min_margin": min(c["min_margin"] for c in gd["greedy"]["cases"]),
        "greedy_cached_agrees": all(c["cached_decode_agrees"] for c in gd["greedy"]["cases"]),
        "model_dir_bytes": total, "safetensors_bytes": files.get("model.safetensors"),
        "params": tr["params"], "steps": tr["steps"], "train_seconds": tr["train_seconds"],
        "tokens_per_second": tr["tokens_per_second"], "tokens_seen": tr["tokens_seen"], "epochs": tr["epochs"],
        "train_tokens": tr["train_tokens"], "stop_reason": tr["stop_reason"], "complete": tr["complete"],
        "selected": tr["selected"], "export_ok": ex["ok"], "readme_placeholders_left": left,
        "phases_seconds": phases, "corpus": man["corpus"], "python": man["python_version"].split()[0],
    }
    write_json(os.path.join(out, "summary.json"), summary)
    print("=" * 78)
    print("HOUSE MODEL SUMMARY")
    print(f"  held-out test ppl      {test['ppl']:.3f}  (nll {test['nll_per_token']:.4f}, {test['tokens']} tokens, "
          f"top-1 {test['top1_acc']:.3f})")
    print(f"  MTP t+2 top-1          {test['mtp_top1_acc']:.3f}  "
          f"(agrees with main argmax {test['mtp_agree_main_acc']:.3f})")
    print(f"  fixture heldout.txt    ppl {gd['heldout']['ppl']:.3f} over {gd['heldout']['tokens']} tokens "
          f"(window {gd['heldout']['window']})")
    print(f"  greedy goldens         min margin {summary['greedy_min_margin']:.4f}, cached decode agrees: "
          f"{summary['greedy_cached_agrees']}")
    print(f"  training               {tr['steps']} steps, {tr['train_seconds']:.0f}s, {tr['tokens_seen'] / 1e6:.1f}M "
          f"tokens ({tr['epochs']} epochs of {tr['train_tokens'] / 1e6:.2f}M), {tr['tokens_per_second']} tok/s, "
          f"stop: {tr['stop_reason']}, selected {tr['selected']}")
    print(f"  model                  {tr['params'] / 1e6:.2f}M params, dir {total / 1e6:.2f} MB "
          f"(safetensors {files.get('model.safetensors', 0) / 1e6:.2f} MB), export check "
          f"{'OK' if ex['ok'] else 'FAILED'}")
    print(f"  corpus                 {man['corpus']}, python {summary['python']}")
    if phases:
        print("  phases (s)             " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()))
    if left:
        print(f"  README placeholders left unfilled: {left}")
    print("=" * 78)
    return 0 if ex["ok"] and not left else 1


if __name__ == "__main__":
    sys.exit(main())
