#!/usr/bin/env python3
"""Train the tiny byte-level BPE tokenizer that tiny checkpoints (`deltaflow make-tiny`) ship with.

It has the shape of the Qwen3.5 tokenizer (docs: qwen35-architecture.md section 7) at a toy size:
  normalizer NFC; pre-tokenizer Sequence[Split(Qwen3.5 regex, isolated), ByteLevel(add_prefix_space=False,
  use_regex=False)]; ByteLevel post-processor and decoder; BPE without unk token or byte fallback;
  exactly 1024 ids: 998 BPE tokens (256 byte symbols + 742 merges) then the 26 Qwen added tokens at 998..1023,
  in Qwen's order.

The training text is English and code found on any machine with Python: a fixed list of standard-library
modules of the running interpreter plus a few licence texts when present. The output depends on that text, so
the committed files are the artefact; the script prints the files used and the corpus digest.

Usage (tokenizers 0.23.2, as on the GPU machine):
  python tools/tiny_tokenizer/train_tiny_tokenizer.py --out assets/tiny-tokenizer
"""

import argparse
import hashlib
import json
import os
import sysconfig

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen's added tokens in id order (Qwen3 tokenizer.json, ids 151643..151668; Qwen3.5 has the same list at
# 248044..248069). Qwen3.5 marks the think / tool-call / tool-response tags as non-special.
ADDED_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
]
NON_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}

TOTAL_IDS = 1024
BPE_SIZE = TOTAL_IDS - len(ADDED_TOKENS)

STDLIB_FILES = [
    "argparse.py", "ast.py", "bisect.py", "calendar.py", "collections/__init__.py", "configparser.py",
    "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "datetime.py", "difflib.py", "enum.py",
    "fractions.py", "functools.py", "gettext.py", "heapq.py", "inspect.py", "json/__init__.py",
    "json/decoder.py", "json/encoder.py", "logging/__init__.py", "pathlib.py", "pprint.py", "random.py",
    "shutil.py", "statistics.py", "string.py", "textwrap.py", "threading.py", "typing.py", "unittest/case.py",
    "urllib/parse.py", "uuid.py", "zipfile.py",
]
LICENCE_FILES = ["/usr/share/common-licenses/Apache-2.0", "/usr/share/common-licenses/GPL-3"]


def corpus():
    stdlib = sysconfig.get_paths()["stdlib"]
    paths = [os.path.join(stdlib, f) for f in STDLIB_FILES] + LICENCE_FILES
    texts, used = [], []
    for p in paths:
        if os.path.isfile(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
            used.append(p)
    return texts, used


def build(texts):
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=BPE_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size(with_added_tokens=False) != BPE_SIZE:
        raise SystemExit(f"trained {tok.get_vocab_size(with_added_tokens=False)} BPE tokens, want {BPE_SIZE}: "
                         "not enough training text")
    # One at a time, in order, so ids are consecutive.
    for content in ADDED_TOKENS:
        special = content not in NON_SPECIAL
        t = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        (tok.add_special_tokens if special else tok.add_tokens)([t])
    for i, content in enumerate(ADDED_TOKENS):
        if tok.token_to_id(content) != BPE_SIZE + i:
            raise SystemExit(f"{content} got id {tok.token_to_id(content)}, want {BPE_SIZE + i}")
    if tok.get_vocab_size(with_added_tokens=True) != TOTAL_IDS:
        raise SystemExit(f"vocab size {tok.get_vocab_size(with_added_tokens=True)}, want {TOTAL_IDS}")
    return tok


def tokenizer_config():
    decoder = {}
    for i, content in enumerate(ADDED_TOKENS):
        decoder[str(BPE_SIZE + i)] = {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": content not in NON_SPECIAL}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [c for c in ADDED_TOKENS if c not in NON_SPECIAL and c != "<|endoftext|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (tokenizer.json, tokenizer_config.json)")
    args = ap.parse_args()
    texts, used = corpus()
    digest = hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest()
    tok = build(texts)
    os.makedirs(args.out, exist_ok=True)
    data = json.loads(tok.to_str())
    # The Python binding serializes decoders.ByteLevel with its defaults whatever it is given; write the fields
    # as Qwen's tokenizer.json has them (the decoder ignores them either way).
    data["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    # Compact JSON keeps the file small; tokenizers reads it the same.
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
        f.write("\n")
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(), f, ensure_ascii=False, indent=2)
        f.write("\n")
    import tokenizers
    print(f"tokenizers {tokenizers.__version__}; {len(used)} training files; corpus sha256 {digest}")
    for p in used:
        print("  " + p)


if __name__ == "__main__":
    main()
