#!/usr/bin/env python3
"""Goldens for rope_parameters scaling (model/rope.cpp), from transformers 5.17 in fp32 on the CPU.

The make-tiny dense checkpoint (seed 1) with its config.json's rope_parameters replaced by each case below, and
max_position_embeddings raised to 4 x 4096; one forward pass (no cache) over 300 fixed ids, logits of every
position. A small original_max_position_embeddings makes the scaling matter at these positions.

  <case>.safetensors: ids I32 [300], logits F32 [300, V]; metadata "rope_parameters" (the JSON used)

Usage: python3 make_rope_goldens.py --model DIR --out DIR
"""
import argparse
import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import save_file

CASES = {
    "yarn": {"rope_type": "yarn", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "factor": 4.0,
             "original_max_position_embeddings": 64},
    "yarn_mscale": {"rope_type": "yarn", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "factor": 8.0,
                    "original_max_position_embeddings": 32, "beta_fast": 16, "beta_slow": 2, "mscale": 0.8,
                    "mscale_all_dim": 0.5},
    "linear": {"rope_type": "linear", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "factor": 3.0},
}
N = 300


def main():
    import transformers
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, rp in CASES.items():
        with tempfile.TemporaryDirectory() as d:
            for f in os.listdir(a.model):
                shutil.copy(os.path.join(a.model, f), d)
            cfg = json.load(open(os.path.join(d, "config.json")))
            rp = dict(rp, mrope_section=cfg["rope_parameters"].get("mrope_section"),
                      mrope_interleaved=cfg["rope_parameters"].get("mrope_interleaved"))
            rp = {k: v for k, v in rp.items() if v is not None}
            cfg["rope_parameters"] = rp
            cfg["max_position_embeddings"] = 4 * 4096
            json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
            model = transformers.Qwen3_5ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
            g = torch.Generator().manual_seed(11)
            ids = torch.randint(0, model.config.vocab_size, (1, N), generator=g)
            with torch.no_grad():
                logits = model(input_ids=ids, use_cache=False).logits[0]
            save_file({"ids": ids[0].to(torch.int32), "logits": logits.float().contiguous()},
                      os.path.join(a.out, name + ".safetensors"),
                      metadata={"rope_parameters": json.dumps(rp), "transformers": transformers.__version__,
                                "torch": torch.__version__})
            print(name, json.dumps(rp), float(logits.abs().max()))


if __name__ == "__main__":
    main()
