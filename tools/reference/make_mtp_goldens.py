#!/usr/bin/env python3
"""Goldens for the MTP head (speculative decoding), from a direct PyTorch transcription of the reference.

transformers 5.17 has no MTP implementation (it ignores mtp.*); the reference is vLLM's qwen3_5_mtp.py, written
out in qwen35-architecture.md §4. This script builds the head from transformers' own decoder-layer class of the
checkpoint's architecture (a config copy with one full-attention layer, so the layer's math is exactly a main
full-attention layer's), loads the checkpoint's mtp.* tensors into it, and runs it in fp32 on the CPU:

  e  = RMSNorm1p(embed(ids[i+1]); pre_fc_norm_embedding)
  hn = RMSNorm1p(h[i]; pre_fc_norm_hidden)          h: the main model's final hidden state after model.norm
  u  = fc(cat([e, hn]))                            embedding first
  u  = decoder layer(u) at positions 0..n-2, causal over the head's own sequence
  mtp_logits[i] = lm_head(RMSNorm1p(u; mtp.norm))  predicts ids[i+2]

Per preset it writes mtp_<preset>.safetensors:
  ids          I32 [n]        a fixed id sequence (n = 40)
  mtp_logits   F32 [n-1, V]   the head's logits at rows 0..n-2 (row i pairs h[i] with ids[i+1])
  chain_ids    I32 [3]        greedy drafts from the last row: d1 = argmax(mtp_logits[n-2]), then the head fed
                              its own output h' with d1 at position n-1, then with d2 at position n
                              (what the engine's draft chain computes)

Usage: python3 make_mtp_goldens.py --models DIR --out DIR [--presets dense,moe,next]
"""
import argparse
import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file

N = 40
CHAIN = 3


def fixed_ids(n, vocab, salt):
    x = (4242 + 7919 * salt + n) & 0xFFFFFFFF
    out = []
    for _ in range(n):
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        out.append(x % vocab)
    return out


def classes(model_type):
    import transformers
    if model_type in ("qwen3_5", "qwen3_5_text"):
        from transformers.models.qwen3_5 import modeling_qwen3_5 as m
        return transformers.Qwen3_5ForCausalLM, m.Qwen3_5DecoderLayer, m.Qwen3_5RMSNorm
    if model_type in ("qwen3_5_moe", "qwen3_5_moe_text"):
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m
        return transformers.Qwen3_5MoeForCausalLM, m.Qwen3_5MoeDecoderLayer, m.Qwen3_5MoeRMSNorm
    if model_type == "qwen3_next":
        from transformers.models.qwen3_next import modeling_qwen3_next as m
        return transformers.Qwen3NextForCausalLM, m.Qwen3NextDecoderLayer, m.Qwen3NextRMSNorm
    raise SystemExit(f"unknown model_type {model_type}")


class Mtp(torch.nn.Module):
    def __init__(self, text_config, layer_cls, norm_cls):
        super().__init__()
        cfg = text_config.__class__.from_dict(text_config.to_dict())
        cfg.num_hidden_layers = 1
        cfg.layer_types = ["full_attention"]
        if hasattr(cfg, "mlp_only_layers"):
            cfg.mlp_only_layers = []
        cfg._attn_implementation = "eager"
        cfg._experts_implementation = getattr(text_config, "_experts_implementation", None) or "eager"
        self.cfg = cfg
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.pre_fc_norm_embedding = norm_cls(h, eps=eps)
        self.pre_fc_norm_hidden = norm_cls(h, eps=eps)
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.layers = torch.nn.ModuleList([layer_cls(cfg, layer_idx=0)])
        self.norm = norm_cls(h, eps=eps)

    def forward(self, hidden, next_embeds, position_embeddings):
        from transformers.masking_utils import create_causal_mask
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], -1))
        mask = create_causal_mask(config=self.cfg, inputs_embeds=u, attention_mask=None, past_key_values=None)
        for layer in self.layers:
            out = layer(u, position_embeddings=position_embeddings, attention_mask=mask)
            u = out[0] if isinstance(out, (tuple, list)) else out
        return self.norm(u)


def load_mtp_state(model_dir, mtp):
    """The checkpoint's mtp.* tensors in the module's names; per-expert tensors stacked into the fused layout
    transformers' expert modules hold."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    raw = {}
    for f in files:
        with safe_open(os.path.join(model_dir, f), "pt") as st:
            for k in st.keys():
                if k.startswith("mtp."):
                    raw[k[len("mtp."):]] = st.get_tensor(k).float()
    want = mtp.state_dict()
    state = {}
    for k in want:
        if k in raw:
            state[k] = raw.pop(k)
    # Fused experts from per-expert tensors.
    for k in want:
        if k in state:
            continue
        if k.endswith("experts.gate_up_proj"):
            p = k[: -len("gate_up_proj")]
            E = want[k].shape[0]
            state[k] = torch.stack([torch.cat([raw.pop(f"{p}{e}.gate_proj.weight"), raw.pop(f"{p}{e}.up_proj.weight")], 0)
                                    for e in range(E)])
        elif k.endswith("experts.down_proj"):
            p = k[: -len("down_proj")]
            E = want[k].shape[0]
            state[k] = torch.stack([raw.pop(f"{p}{e}.down_proj.weight") for e in range(E)])
    missing = [k for k in want if k not in state]
    if missing or raw:
        raise SystemExit(f"{model_dir}: MTP tensors missing {missing[:4]} or left over {list(raw)[:4]}")
    for k, v in state.items():
        if v.shape != want[k].shape:
            raise SystemExit(f"{model_dir}: {k} has shape {tuple(v.shape)}, expected {tuple(want[k].shape)}")
    mtp.load_state_dict(state)


def goldens_for(model_dir, salt):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    model_type = config.get("text_config", config)["model_type"]
    cls, layer_cls, norm_cls = classes(model_type)
    model = cls.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    text = model.config
    mtp = Mtp(text, layer_cls, norm_cls).float().eval()
    load_mtp_state(model_dir, mtp)
    ids = fixed_ids(N, text.vocab_size, salt)

    def rotary(x, positions):
        pos = torch.tensor([positions])
        if getattr(model.model.rotary_emb, "mrope_section", None) is not None or model_type.startswith("qwen3_5"):
            pos = pos.view(1, 1, -1).expand(3, 1, -1)
        return model.model.rotary_emb(x, pos)

    with torch.no_grad():
        h = model.model(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state  # after model.norm
        nxt = model.model.embed_tokens(torch.tensor([ids[1:]]))
        hh = h[:, : N - 1]
        out = mtp(hh, nxt, rotary(hh, list(range(N - 1))))
        logits = model.lm_head(out)[0]
        # The chain: append rows (h', d) at the next positions and rerun the causal head over the whole sequence
        # (the same numbers as a KV-cached single-row step).
        chain = [int(torch.argmax(logits[-1]))]
        hs, es, last = hh, nxt, out[:, -1:]
        for _ in range(CHAIN - 1):
            hs = torch.cat([hs, last], 1)
            es = torch.cat([es, model.model.embed_tokens(torch.tensor([[chain[-1]]]))], 1)
            o = mtp(hs, es, rotary(hs, list(range(hs.shape[1]))))
            last = o[:, -1:]
            chain.append(int(torch.argmax(model.lm_head(last)[0, -1])))
    import transformers
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "device": "cpu",
            "dtype": "float32", "reference": "tools/reference/make_mtp_goldens.py (vLLM qwen3_5_mtp.py transcribed)"}
    return {"ids": torch.tensor(ids, dtype=torch.int32), "mtp_logits": logits.float().contiguous(),
            "chain_ids": torch.tensor(chain, dtype=torch.int32)}, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--presets", default="dense,moe,next")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for p in a.presets.split(","):
        tensors, meta = goldens_for(os.path.join(a.models, p), sum(map(ord, p)))
        save_file(tensors, os.path.join(a.out, f"mtp_{p}.safetensors"), metadata=meta)
        print(f"{p}: chain {tensors['chain_ids'].tolist()}, logits {tuple(tensors['mtp_logits'].shape)}", flush=True)


if __name__ == "__main__":
    main()
