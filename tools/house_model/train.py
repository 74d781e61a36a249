#!/usr/bin/env python3
"""Train the house model: transformers' Qwen3_5ForCausalLM (small config, real structure) + an MTP head trained
jointly, on the token ids written by train_tokenizer.py.

Loss = CE(main, t+1) + mtp_weight * CE(MTP, t+2)   (mtp_weight 0.3 by default; the MTP gradient also reaches the
trunk, as in DeepSeek-V3 / Qwen3-Next MTP training).

Schedule: defined by time, not steps. progress = training seconds so far / (--minutes * 60), accumulated across
resumes; cosine from lr to --min-lr-frac * lr after the first --warmup-frac, under a linear warmup that lasts for
--warmup-frac of the budget and at least --warmup-steps steps. Training stops when progress
reaches 1, or at --deadline (a Unix time: the hard stop for this process, set by run_all.sh from its total budget),
whichever comes first; at a deadline stop the checkpoint is saved and the run is marked incomplete (resume with
--resume, same --ckpt-dir). Batches are a function of (seed, step), so a resumed run sees the same data.

Writes OUT/work/final.pt (fp32 weights of the selected model + config), OUT/work/train_summary.json,
OUT/work/train_log.jsonl, and the resumable checkpoint CKPT_DIR/ckpt.pt.
"""
import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from common import (SIZES, HouseModel, log, make_text_config, param_groups, read_json,
                    score_windows, seed_everything, text_config_kwargs, write_json)


def lr_at(progress, step, peak, warmup_frac, warmup_steps, min_frac):
    """Cosine over the time budget (progress in [0, 1]), times a linear warmup that lasts until both warmup_frac of
    the budget and warmup_steps steps have passed (a slow first step must not skip the warmup)."""
    p = min(1.0, max(0.0, (progress - warmup_frac) / max(1e-9, 1.0 - warmup_frac)))
    lr = peak * (min_frac + (1.0 - min_frac) * 0.5 * (1.0 + math.cos(math.pi * p)))
    warm = min(progress / max(1e-9, warmup_frac), (step + 1) / max(1, warmup_steps))
    return lr * min(1.0, max(0.01, warm))


def batch_offsets(seed, step, n_seqs, n_tokens, span):
    rng = np.random.default_rng([seed, step])
    return rng.integers(0, n_tokens - span, size=n_seqs, dtype=np.int64)


def save_atomic(obj, path):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny model, short context, CPU-friendly")
    ap.add_argument("--size", choices=["small", "large"], default="small",
                    help="small: 16.2M params / 32 MB (default); large: 28.4M / 57 MB (see common.SIZES)")
    ap.add_argument("--minutes", type=float, default=7.0, help="training time the LR schedule spans (all resumes)")
    ap.add_argument("--deadline", type=float, default=0.0, help="Unix time at which this process must stop training")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--ckpt-dir", default="")
    ap.add_argument("--ckpt-every-sec", type=float, default=150.0)
    ap.add_argument("--eval-every-sec", type=float, default=45.0)
    ap.add_argument("--seq-len", type=int, default=0, help="training context (default 1024; smoke 128)")
    ap.add_argument("--batch-tokens", type=int, default=0, help="tokens per optimizer step (default 65536)")
    ap.add_argument("--micro-batch", type=int, default=0, help="sequences per forward (default: all; halves on OOM)")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup-frac", type=float, default=0.04)
    ap.add_argument("--warmup-steps", type=int, default=0, help="minimum warmup steps (default 50; smoke 3)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--max-position-embeddings", type=int, default=4096)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (testing)")
    ap.add_argument("--val-tokens", type=int, default=0, help="validation tokens per periodic eval")
    ap.add_argument("--test-tokens", type=int, default=0, help="cap on test tokens for the final eval (0 = all)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    work = os.path.join(args.out, "work")
    ckpt_dir = args.ckpt_dir or os.path.join(args.out, "ckpt")
    os.makedirs(ckpt_dir, exist_ok=True)
    ckpt_path = os.path.join(ckpt_dir, "ckpt.pt")
    seq_len = args.seq_len or (128 if args.smoke else 1024)
    batch_tokens = args.batch_tokens or (8 * 128 if args.smoke else 65536)
    n_seqs = max(1, batch_tokens // seq_len)
    warmup_steps = args.warmup_steps or (3 if args.smoke else 50)
    val_tokens = args.val_tokens or (16 * 128 if args.smoke else 128 * 1024)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    is_cuda = device.type == "cuda"
    if is_cuda:
        torch.set_float32_matmul_precision("high")  # training only: the GDN fallback's fp32 matmuls use TF32
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    amp_dtype = torch.bfloat16 if is_cuda else None  # CPU smoke runs in fp32 (bf16 autocast on CPU is slow)

    # --- data ---
    ids = {s: torch.from_numpy(np.load(os.path.join(work, f"ids_{s}.npy")).astype(np.int64))
           for s in ("train", "val", "test")}
    tok_cfg = read_json(os.path.join(args.out, "model", "tokenizer_config.json"))
    vocab = {v["content"]: int(k) for k, v in tok_cfg["added_tokens_decoder"].items()}
    vocab_size = max(vocab.values()) + 1
    eot = vocab["<|endoftext|>"]
    train_ids = ids["train"].to(device)
    n_train = train_ids.numel()
    span = seq_len + 2
    if n_train < span + 1:
        raise SystemExit("training stream shorter than one window")
    log(f"data: train {n_train} tokens, val {ids['val'].numel()}, test {ids['test'].numel()}; vocab {vocab_size}")

    # --- model ---
    seed_everything(args.seed)
    size_name = "smoke" if args.smoke else args.size
    cfg_kwargs = text_config_kwargs(SIZES[size_name], vocab_size,
                                    args.max_position_embeddings, eos_token_id=eot, pad_token_id=eot)
    cfg = make_text_config(cfg_kwargs)
    model = HouseModel(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in model.mtp.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters ({n_mtp / 1e6:.2f}M MTP), {2 * n_params / 1e6:.1f} MB in bf16; "
        f"layers {cfg.layer_types}; attn {cfg._attn_implementation}; device {device}")
    opt = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=is_cuda)

    state = {"step": 0, "train_seconds": 0.0, "tokens": 0, "best_val": None, "best_step": None,
             "schedule_minutes": args.minutes, "runs": 0}
    best_state = None
    if args.resume and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        if ck["text_config"] != cfg_kwargs:
            raise SystemExit("checkpoint was trained with a different config")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optim"])
        state.update(ck["state"])
        state["schedule_minutes"] = args.minutes  # --minutes may extend (or shorten) the schedule on resume
        best_state = ck.get("best_model")
        log(f"resumed from {ckpt_path}: step {state['step']}, {state['train_seconds']:.0f}s trained")
    elif args.resume:
        log(f"--resume: no checkpoint at {ckpt_path}, starting fresh")
    state["runs"] += 1
    budget = state["schedule_minutes"] * 60.0
    if args.deadline and state["train_seconds"] == 0.0:
        # Fresh run under a hard deadline: shrink the schedule so the cosine completes before it. Wall time also
        # pays for periodic evals and checkpoints, hence the margin.
        avail = 0.95 * (args.deadline - time.time()) - 5.0
        if avail < budget:
            log(f"schedule shortened to fit the deadline: {budget:.0f}s -> {max(avail, 1.0):.0f}s")
            budget = max(avail, 1.0)
            state["schedule_minutes"] = budget / 60.0

    def checkpoint(reason):
        t = time.time()
        save_atomic({"model": model.state_dict(), "optim": opt.state_dict(), "state": dict(state),
                     "text_config": cfg_kwargs, "best_model": best_state, "args": vars(args)}, ckpt_path)
        log(f"checkpoint ({reason}) -> {ckpt_path} in {time.time() - t:.1f}s")

    val_stream = ids["val"][:val_tokens]
    eval_batch = 16 if is_cuda else 4

    def val_loss():
        r = score_windows(model, val_stream, seq_len, device, autocast_dtype=amp_dtype, batch=eval_batch)
        model.train()
        return r["nll_per_token"], r["mtp_nll_per_token"]

    evaluated = {"step": None}

    def periodic_eval(best_state):
        te = time.time()
        vl, vm = val_loss()
        evaluated["step"] = state["step"]
        is_best = state["best_val"] is None or vl < state["best_val"]
        if is_best:
            state["best_val"], state["best_step"] = vl, state["step"]
            best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        log(f"eval step {state['step']}: val nll {vl:.4f} (ppl {math.exp(vl):.2f})  mtp nll {vm:.4f}"
            f"{'  *best*' if is_best else ''}  ({time.time() - te:.1f}s)")
        logf.write(json.dumps({"step": state["step"], "val_nll": vl, "val_mtp_nll": vm}) + "\n")
        logf.flush()
        return best_state

    micro = args.micro_batch or n_seqs
    log_path = os.path.join(work, "train_log.jsonl")
    logf = open(log_path, "a", encoding="utf-8")
    model.train()
    stop_reason = "schedule complete" if state["train_seconds"] >= budget else None
    last_eval = last_ckpt = time.time()
    win_t, win_tokens, win_loss, win_mtp, win_n = time.time(), 0, 0.0, 0.0, 0
    step_times = []
    log(f"train: seq {seq_len}, {n_seqs} seqs/step ({n_seqs * seq_len} tokens), micro {micro}, lr {args.lr}, "
        f"schedule {budget:.0f}s, mtp_weight {args.mtp_weight}")
    while stop_reason is None:
        now = time.time()
        if args.deadline and now >= args.deadline:
            stop_reason = "deadline"
            break
        if args.max_steps and state["step"] >= args.max_steps:
            stop_reason = "max_steps"
            break
        t_step = time.time()
        lr = lr_at(state["train_seconds"] / budget, state["step"], args.lr, args.warmup_frac, warmup_steps,
                   args.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        off = torch.from_numpy(batch_offsets(args.seed, state["step"], n_seqs, n_train, span)).to(device)
        windows = train_ids[off[:, None] + torch.arange(span, device=device)[None, :]]
        while True:
            logits = mtp_logits = None
            try:
                opt.zero_grad(set_to_none=True)
                loss_sum = mtp_sum = 0.0
                for i in range(0, n_seqs, micro):
                    w = windows[i:i + micro]
                    frac = w.shape[0] / n_seqs
                    ctx = torch.autocast(device_type="cuda", dtype=amp_dtype) if amp_dtype else _Null()
                    with ctx:
                        logits, mtp_logits = model(w)
                    lm = F.cross_entropy(logits.float().reshape(-1, vocab_size), w[:, 1:seq_len + 1].reshape(-1))
                    lt = F.cross_entropy(mtp_logits.float().reshape(-1, vocab_size), w[:, 2:].reshape(-1))
                    ((lm + args.mtp_weight * lt) * frac).backward()
                    loss_sum = loss_sum + lm.detach() * frac
                    mtp_sum = mtp_sum + lt.detach() * frac
                break
            except torch.OutOfMemoryError:
                if micro == 1:
                    raise
                logits = mtp_logits = None
                opt.zero_grad(set_to_none=True)
                if is_cuda:
                    torch.cuda.empty_cache()
                micro = max(1, micro // 2)
                log(f"OOM: micro-batch -> {micro}")
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        state["step"] += 1
        state["tokens"] += n_seqs * seq_len
        win_tokens += n_seqs * seq_len
        win_loss += loss_sum
        win_mtp += mtp_sum
        win_n += 1
        log_every = 10 if state["step"] > 20 else 1
        if state["step"] % log_every == 0:
            lv, mv, gv = float(win_loss / win_n), float(win_mtp / win_n), float(gnorm)  # syncs
            dt = time.time() - win_t
            tps = win_tokens / max(1e-9, dt)
            rec = {"step": state["step"], "train_seconds": round(state["train_seconds"], 2), "lr": lr,
                   "loss": lv, "mtp_loss": mv, "grad_norm": gv, "tokens_per_s": round(tps)}
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
            if state["step"] <= 3 or state["step"] % 50 == 0:
                log(f"step {state['step']}  loss {lv:.4f}  mtp {mv:.4f}  lr {lr:.2e}  gnorm {gv:.2f}  "
                    f"{tps / 1e3:.1f}k tok/s  {state['train_seconds']:.0f}/{budget:.0f}s")
            if not math.isfinite(lv):
                raise SystemExit("loss is not finite")
            win_t, win_tokens, win_loss, win_mtp, win_n = time.time(), 0, 0.0, 0.0, 0
        dt_step = time.time() - t_step
        state["train_seconds"] += dt_step
        step_times.append(dt_step)
        if state["train_seconds"] >= budget:
            stop_reason = "schedule complete"
        if time.time() - last_eval >= args.eval_every_sec or stop_reason:
            best_state = periodic_eval(best_state)
            last_eval = time.time()
            win_t = time.time()
        if time.time() - last_ckpt >= args.ckpt_every_sec and not stop_reason:
            checkpoint("periodic")
            last_ckpt = time.time()
            win_t = time.time()
    if evaluated["step"] != state["step"] and state["step"] > 0:
        best_state = periodic_eval(best_state)  # the final weights compete for selection too
    logf.close()
    log(f"training stopped: {stop_reason} at step {state['step']}, {state['train_seconds']:.0f}s, "
        f"{state['tokens'] / 1e6:.1f}M tokens")
    checkpoint(stop_reason)

    # --- select and evaluate (bf16-rounded weights, fp32 math = exactly what export.py ships) ---
    final_val = state["best_val"]
    selected = "final"
    if best_state is not None and state["best_step"] != state["step"]:
        selected = f"best (step {state['best_step']})"
        model.load_state_dict({k: v.to(device) for k, v in best_state.items()})
    fp32_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    if is_cuda:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    t = time.time()
    test_cap = args.test_tokens or (4096 if args.smoke else 0)
    test = score_windows(model, ids["test"], seq_len, device, max_tokens=test_cap, batch=eval_batch)
    val = score_windows(model, ids["val"][:val_tokens], seq_len, device, batch=eval_batch)
    log(f"selected {selected}; test ({test['tokens']} tokens, window {test['window']}): ppl {test['ppl']:.3f}  "
        f"top1 {test['top1_acc']:.3f}  MTP t+2 top1 {test['mtp_top1_acc']:.3f}  "
        f"MTP==main argmax {test['mtp_agree_main_acc']:.3f}  ({time.time() - t:.1f}s)")
    # state_dict: the bf16-rounded weights that export.py ships (as fp32); state_dict_fp32: the trained fp32 master
    # weights, for export.py's check of what the bf16 rounding costs.
    torch.save({"text_config": cfg_kwargs, "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                "state_dict_fp32": fp32_state, "selected": selected}, os.path.join(work, "final.pt"))
    st = sorted(step_times[5:]) or step_times
    summary = {
        "stop_reason": stop_reason,
        "complete": stop_reason in ("schedule complete", "max_steps"),
        "steps": state["step"],
        "train_seconds": round(state["train_seconds"], 1),
        "tokens_seen": state["tokens"],
        "epochs": round(state["tokens"] / n_train, 2),
        "tokens_per_second": round(n_seqs * seq_len / st[len(st) // 2]) if st else None,
        "median_step_seconds": round(st[len(st) // 2], 4) if st else None,
        "runs": state["runs"],
        "selected": selected,
        "best_val_nll": final_val,
        "best_step": state["best_step"],
        "seq_len": seq_len,
        "batch_tokens": n_seqs * seq_len,
        "micro_batch": micro,
        "lr": args.lr, "min_lr_frac": args.min_lr_frac, "warmup_frac": args.warmup_frac, "warmup_steps": warmup_steps,
        "weight_decay": args.weight_decay, "grad_clip": args.grad_clip, "mtp_weight": args.mtp_weight,
        "schedule_minutes": state["schedule_minutes"], "seed": args.seed,
        "size": size_name, "params": n_params, "params_mtp": n_mtp,
        "device": torch.cuda.get_device_name(0) if is_cuda else "CPU",
        "precision": "bf16 autocast with fp32 master weights" if amp_dtype else "fp32",
        "torch": torch.__version__,
        "train_tokens": n_train,
        "test": {k: v for k, v in test.items() if k != "windows"},
        "val": {k: v for k, v in val.items() if k != "windows"},
    }
    write_json(os.path.join(work, "train_summary.json"), summary)


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    main()
