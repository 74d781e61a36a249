"""Shared pieces of the house-model pipeline: tokenizer constants, the model config, the MTP module.

Everything here is plain PyTorch + transformers 5.17 (Qwen3_5ForCausalLM and its own Qwen3_5DecoderLayer /
Qwen3_5RMSNorm classes), so the math the C++ engine must reproduce is exactly transformers' math.
"""
import hashlib
import json
import math
import os
import time

import torch
from torch import nn

# --- tokenizer ---------------------------------------------------------------------------------------------------

# Qwen3.5 pre-tokenizer regex (qwen35-architecture.md §7): Qwen2/3's with \p{M} added in two branches.
QWEN35_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The 26 Qwen added tokens, in Qwen's id order (checked against /work/shared/data/qwen3-tokenizer/tokenizer.json):
# (content, special). tool_call/fim/repo/file_sep/tool_response/think are added but not "special".
QWEN_ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

# --- model sizes -------------------------------------------------------------------------------------------------

# Model sizes. All keep Qwen3.5's structure: 8 layers L L L F L L L F, GQA, gated attention with head_dim 128 and a
# 32-wide rotary part (so mrope_section sums to 16), Gated DeltaNet with 2 value heads per key head, tied embeddings.
#
# "small" (default): 16.2M parameters with the MTP = 32.3 MB in bf16. It leaves room in the 64 MiB working tree that
#   the device tool sends (the repo was 18.7 MB without the model when this was written).
# "large": 28.4M parameters = 56.8 MB, just under the 60 MB cap, but the repo plus this model no longer fits
#   in the device tool's 64 MiB tree.
SIZES = {
    "small": dict(
        hidden_size=384,
        intermediate_size=768,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        mrope_section=[6, 5, 5],
    ),
    "large": dict(
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        mrope_section=[6, 5, 5],
    ),
    # --smoke: a few hundred thousand parameters, same structure (both layer types, GQA, gated attention, MTP).
    "smoke": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        mrope_section=[2, 1, 1],
    ),
}

ROPE_THETA = 10000000.0
PARTIAL_ROTARY_FACTOR = 0.25
FULL_ATTENTION_INTERVAL = 4


def text_config_kwargs(size, vocab_size, max_position_embeddings, eos_token_id, pad_token_id):
    """Keyword arguments for Qwen3_5TextConfig (also the body of config.json's text_config)."""
    s = dict(size)
    mrope_section = s.pop("mrope_section")
    rotary_dim = int(s["head_dim"] * PARTIAL_ROTARY_FACTOR)
    if 2 * sum(mrope_section) != rotary_dim:
        raise ValueError(f"mrope_section {mrope_section} must sum to rotary_dim/2 = {rotary_dim // 2}")
    n = s["num_hidden_layers"]
    layer_types = [
        "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention" for i in range(n)
    ]
    return dict(
        vocab_size=vocab_size,
        **s,
        linear_conv_kernel_dim=4,
        hidden_act="silu",
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=False,
        attention_dropout=0.0,
        layer_types=layer_types,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "partial_rotary_factor": PARTIAL_ROTARY_FACTOR,
            "mrope_section": mrope_section,
            "mrope_interleaved": True,
        },
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )


def make_text_config(kwargs):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(**kwargs)


# --- MTP ---------------------------------------------------------------------------------------------------------


class MTP(nn.Module):
    """Qwen3.5 multi-token-prediction module, named like the official checkpoints' mtp.* tensors.

    Row i pairs the main model's final (post-norm) hidden state at position i with the embedding of token i+1 and
    predicts token i+2 (vLLM qwen3_5_mtp.py; qwen35-architecture.md §4):
        e  = RMSNorm1p(embed(tok[i+1]); pre_fc_norm_embedding)
        hn = RMSNorm1p(h[i]; pre_fc_norm_hidden)
        u  = fc(cat([e, hn], -1))            # embedding first, then hidden
        u  = full-attention decoder layer(u, positions i)   (causal over the MTP sequence)
        logits = lm_head(RMSNorm1p(u; norm))
    The decoder layer is transformers' own Qwen3_5DecoderLayer built from a config whose layer_types[0] is
    "full_attention", so its math is exactly a main-model full-attention layer's.
    """

    def __init__(self, text_config):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        kw = text_config.to_dict()
        mtp_cfg = type(text_config)(
            **{
                k: kw[k]
                for k in text_config_field_names(text_config)
                if k not in ("num_hidden_layers", "layer_types")
            },
            num_hidden_layers=1,
            layer_types=["full_attention"],
        )
        mtp_cfg._attn_implementation = text_config._attn_implementation
        self.mtp_config = mtp_cfg
        h = text_config.hidden_size
        eps = text_config.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(mtp_cfg, layer_idx=0)])
        self.norm = Qwen3_5RMSNorm(h, eps=eps)

    def forward(self, hidden_post_norm, next_token_embeds, position_embeddings):
        """hidden_post_norm, next_token_embeds: [B, T, H]; position_embeddings: (cos, sin) for positions 0..T-1.
        Returns the MTP hidden state after mtp.norm, [B, T, H] (feed it to lm_head)."""
        from transformers.masking_utils import create_causal_mask

        e = self.pre_fc_norm_embedding(next_token_embeds)
        hn = self.pre_fc_norm_hidden(hidden_post_norm)
        u = self.fc(torch.cat([e, hn], dim=-1))
        mask = create_causal_mask(
            config=self.mtp_config, inputs_embeds=u, attention_mask=None, past_key_values=None
        )
        for layer in self.layers:
            u = layer(u, position_embeddings=position_embeddings, attention_mask=mask)
        return self.norm(u)


def text_config_field_names(cfg):
    """The constructor fields of a (strict, dataclass-like) transformers config."""
    import dataclasses

    if dataclasses.is_dataclass(cfg):
        return [f.name for f in dataclasses.fields(cfg) if f.init]
    return list(cfg.to_dict().keys())


def init_mtp_(mtp, std):
    """Same initialisation transformers gives a decoder layer: normal(0, std) Linear weights, zero (1+w) norms."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    for m in mtp.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        elif isinstance(m, Qwen3_5RMSNorm):
            nn.init.zeros_(m.weight)


class HouseModel(nn.Module):
    """Qwen3_5ForCausalLM + MTP, sharing embed_tokens and lm_head (tied)."""

    def __init__(self, text_config, lm=None):
        super().__init__()
        from transformers import Qwen3_5ForCausalLM

        self.lm = lm if lm is not None else Qwen3_5ForCausalLM(text_config)
        self.mtp = MTP(self.lm.config)
        init_mtp_(self.mtp, self.lm.config.initializer_range)

    def rotary(self, hidden, T):
        B = hidden.shape[0]
        pos = torch.arange(T, device=hidden.device).view(1, 1, T).expand(3, B, T)
        return self.lm.model.rotary_emb(hidden, pos)

    def forward(self, window):
        """window: [B, T+2] token ids. Returns (main_logits [B,T,V] for targets window[:,1:T+1],
        mtp_logits [B,T,V] for targets window[:,2:T+2])."""
        T = window.shape[1] - 2
        x = window[:, :T]
        out = self.lm.model(input_ids=x, use_cache=False)
        h = out.last_hidden_state  # after model.norm: what vLLM feeds the MTP
        logits = self.lm.lm_head(h)
        e = self.lm.model.embed_tokens(window[:, 1 : T + 1])
        u = self.mtp(h, e, self.rotary(h, T))
        mtp_logits = self.lm.lm_head(u)
        return logits, mtp_logits

    def mtp_from_hidden(self, h, next_ids):
        """MTP logits from given post-norm hidden states [B,T,H] and next-token ids [B,T]."""
        e = self.lm.model.embed_tokens(next_ids)
        u = self.mtp(h, e, self.rotary(h, h.shape[1]))
        return self.lm.lm_head(u)


@torch.no_grad()
def score_windows(house, ids, window, device, autocast_dtype=None, with_mtp=True, max_tokens=0, batch=1):
    """Score a token stream the way `deltaflow eval` does: non-overlapping windows of `window` tokens (the last one
    shorter), each scored from its own start with no carried state. In a window of n tokens the main model predicts
    tokens 1..n-1 (n-1 scored positions); the MTP at position i (i <= n-3) predicts token i+2 from h_i and token i+1.
    Windows of equal length may be run `batch` at a time (same math; batch=1 is the plainest reference).
    Returns totals (nats) and per-window details."""
    ids = ids.to(torch.long)
    if max_tokens and ids.numel() > max_tokens:
        ids = ids[:max_tokens]
    house.eval()
    tot = dict(tokens=0, nll=0.0, top1=0, mtp_tokens=0, mtp_nll=0.0, mtp_top1=0, mtp_agree_main=0)
    starts = [s for s in range(0, ids.numel(), window) if min(window, ids.numel() - s) >= 2]
    groups, cur = [], []
    for s in starts:
        n = min(window, ids.numel() - s)
        if cur and (len(cur) == batch or min(window, ids.numel() - cur[0]) != n):
            groups.append(cur)
            cur = []
        cur.append(s)
    if cur:
        groups.append(cur)
    windows = []
    ctx = (lambda: torch.autocast(device_type=device.type, dtype=autocast_dtype)) if autocast_dtype else _nullctx
    for g in groups:
        n = min(window, ids.numel() - g[0])
        w = torch.stack([ids[s:s + n] for s in g]).to(device)  # [b, n]
        with ctx():
            h = house.lm.model(input_ids=w, use_cache=False).last_hidden_state
            logits = house.lm.lm_head(h).float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        tgt = w[:, 1:]
        nll = -lp.gather(2, tgt[..., None])[..., 0].double().sum(1)
        main_arg = logits.argmax(-1)
        top1 = (main_arg[:, :-1] == tgt).sum(1)
        if with_mtp and n >= 3:
            with ctx():
                ml = house.mtp_from_hidden(h[:, : n - 2], w[:, 1 : n - 1]).float()
            t2 = w[:, 2:]
            mnll = -torch.log_softmax(ml, dim=-1).gather(2, t2[..., None])[..., 0].double().sum(1)
            marg = ml.argmax(-1)
            mtop1 = (marg == t2).sum(1)
            # Greedy speculative-decoding proxy: the draft for position i+2 equals the main model's own argmax there.
            magree = (marg == main_arg[:, 1 : n - 1]).sum(1)
        for j, s in enumerate(g):
            rec = {"start": s, "tokens": n - 1, "nll": float(nll[j])}
            tot["tokens"] += n - 1
            tot["nll"] += rec["nll"]
            tot["top1"] += int(top1[j])
            if with_mtp and n >= 3:
                rec.update(mtp_tokens=n - 2, mtp_nll=float(mnll[j]), mtp_top1=int(mtop1[j]))
                tot["mtp_tokens"] += n - 2
                tot["mtp_nll"] += rec["mtp_nll"]
                tot["mtp_top1"] += rec["mtp_top1"]
                tot["mtp_agree_main"] += int(magree[j])
            windows.append(rec)
    res = dict(tot)
    res["ppl"] = math.exp(tot["nll"] / max(1, tot["tokens"]))
    res["nll_per_token"] = tot["nll"] / max(1, tot["tokens"])
    res["top1_acc"] = tot["top1"] / max(1, tot["tokens"])
    if with_mtp:
        res["mtp_nll_per_token"] = tot["mtp_nll"] / max(1, tot["mtp_tokens"])
        res["mtp_top1_acc"] = tot["mtp_top1"] / max(1, tot["mtp_tokens"])
        res["mtp_agree_main_acc"] = tot["mtp_agree_main"] / max(1, tot["mtp_tokens"])
    res["window"] = window
    res["windows"] = windows
    return res


class _nullctx:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def param_groups(model, weight_decay):
    """Weight decay on matrices (incl. the tied embedding), none on norms / dt_bias / A_log / conv (1-D or tiny)."""
    decay, no_decay = [], []
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p.dim() >= 2 and "conv1d" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# --- small utilities ---------------------------------------------------------------------------------------------


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def seed_everything(seed):
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
