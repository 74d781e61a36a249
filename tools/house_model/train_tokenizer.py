#!/usr/bin/env python3
"""Train the house tokenizer (byte-level BPE, Qwen3.5 pre-tokenizer, NFC, Qwen's 26 added tokens at the top ids)
on the training split, write the HF tokenizer files, and encode every split to token ids.

Writes OUT/model/{tokenizer.json, tokenizer_config.json, chat_template.jinja} and OUT/work/ids_{split}.npy
(uint16; each document followed by <|endoftext|>).
"""
import argparse
import hashlib
import json
import os
import shutil
import time

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

from common import QWEN35_SPLIT_REGEX, QWEN_ADDED_TOKENS, log, write_json

HERE = os.path.dirname(os.path.abspath(__file__))


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def build_tokenizer():
    tok = Tokenizer(models.BPE(dropout=None, unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def add_qwen_tokens(tok):
    # One call per token keeps Qwen's order (special and non-special interleave) and so the id layout.
    for content, special in QWEN_ADDED_TOKENS:
        t = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tok.add_special_tokens([t])
        else:
            tok.add_tokens([t])


def normalize_model_fields(path):
    """Make the saved model and decoder sections carry the same explicit fields as Qwen's tokenizer.json."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    m = j["model"]
    fixed = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
             "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False}
    for k, v in fixed.items():
        m[k] = v
    j["model"] = {**fixed, "vocab": m["vocab"], "merges": m["merges"]}
    # decoders.ByteLevel() serialises its (unused) options as true; Qwen's file has them false.
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=2)
        f.write("\n")


def tokenizer_config(added_ids, model_max_length):
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": s}
            for (c, s), i in zip(QWEN_ADDED_TOKENS, added_ids)
        },
        "additional_special_tokens": [c for c, s in QWEN_ADDED_TOKENS if s and c != "<|endoftext|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab-size", type=int, default=8192, help="total, including the 26 added tokens")
    ap.add_argument("--train-mb", type=float, default=40.0,
                    help="BPE is trained on at most this much training text (documents in sha1(path) order)")
    ap.add_argument("--model-max-length", type=int, default=4096)
    args = ap.parse_args()

    work = os.path.join(args.out, "work")
    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    t0 = time.time()
    docs = {s: read_docs(os.path.join(work, f"docs_{s}.jsonl")) for s in ("train", "val", "test")}

    keyed = sorted(docs["train"], key=lambda d: hashlib.sha1((d["src"] + ":" + d["path"]).encode()).hexdigest())
    sample, size = [], 0
    for d in keyed:
        if size >= args.train_mb * 1e6:
            break
        sample.append(d["text"])
        size += len(d["text"].encode("utf-8"))
    log(f"tokenizer: training BPE on {len(sample)} documents, {size / 1e6:.1f} MB")

    n_added = len(QWEN_ADDED_TOKENS)
    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size - n_added, min_frequency=2, show_progress=False,
                                  special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    base = tok.get_vocab_size(with_added_tokens=False)
    if base != args.vocab_size - n_added:
        raise SystemExit(f"BPE produced {base} tokens, wanted {args.vocab_size - n_added} (corpus too small?)")
    add_qwen_tokens(tok)
    added_ids = [tok.token_to_id(c) for c, _ in QWEN_ADDED_TOKENS]
    if added_ids != list(range(base, base + n_added)) or tok.get_vocab_size() != args.vocab_size:
        raise SystemExit(f"added-token ids are not {base}..{base + n_added - 1}: {added_ids}")
    tj = os.path.join(model_dir, "tokenizer.json")
    tok.save(tj)
    normalize_model_fields(tj)
    write_json(os.path.join(model_dir, "tokenizer_config.json"), tokenizer_config(added_ids, args.model_max_length))
    shutil.copyfile(os.path.join(HERE, "chat_template.jinja"), os.path.join(model_dir, "chat_template.jinja"))
    log(f"tokenizer: vocab {tok.get_vocab_size()} (BPE {base} + {n_added} added), {time.time() - t0:.1f}s")

    # Encode. Literal special-token strings inside source files stay text (encode_special_tokens), so a file that
    # mentions "<|im_end|>" does not inject a control token into the training stream.
    tok = Tokenizer.from_file(tj)
    tok.encode_special_tokens = True
    eot = tok.token_to_id("<|endoftext|>")
    stats = {}
    for split, ds in docs.items():
        t1 = time.time()
        parts = []
        texts = [d["text"] for d in ds]
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster, same ids
        for i in range(0, len(texts), 1024):
            for enc in encode(texts[i:i + 1024], add_special_tokens=False):
                parts.append(np.asarray(enc.ids, dtype=np.uint16))
                parts.append(np.asarray([eot], dtype=np.uint16))
        arr = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
        np.save(os.path.join(work, f"ids_{split}.npy"), arr)
        nbytes = sum(len(t.encode("utf-8")) for t in texts)
        stats[split] = {"docs": len(ds), "tokens": int(arr.size), "bytes": nbytes,
                        "bytes_per_token": round(nbytes / max(1, arr.size), 3)}
        log(f"encode {split}: {arr.size} tokens, {nbytes / max(1, arr.size):.2f} bytes/token, {time.time() - t1:.1f}s")
    write_json(os.path.join(work, "token_stats.json"), {"tokenizer_train_docs": len(sample),
                                                        "tokenizer_train_bytes": size, "splits": stats})


if __name__ == "__main__":
    main()
