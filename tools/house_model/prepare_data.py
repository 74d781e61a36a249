#!/usr/bin/env python3
"""Corpus for the house model: the *.py files of this Python's standard library (and, optionally, of its
site-packages), split deterministically into train / val / test, recorded in data_manifest.json.

Split rule: bucket(rel) = int(sha1(rel_posix_path).hexdigest(), 16) % 50, where rel is the path relative to its root
(e.g. "json/decoder.py"). Bucket 0 = test (held-out, reported), bucket 1 = val (checkpoint selection), others = train.
Only standard-library files are ever held out; site-packages files (with --corpus stdlib+site) in buckets 0/1 are
dropped, so the reported numbers are purely standard-library. Identical file contents are kept once (the first in
order: stdlib before site, sorted relative paths).

Nothing depends on a particular Python version's file list: the list is whatever this interpreter has, and the
manifest records it (python version, roots, counts, bytes, the held-out and validation lists).

Site-packages files that look like copies of held-out stdlib code (many long lines in common) are dropped too.

Writes OUT/work/docs_{train,val,test}.jsonl ({"src","path","text"} per line), OUT/data_manifest.json,
OUT/train_files.txt and OUT/fixtures/heldout.txt (20-50 KB of held-out stdlib text, whole files in sorted order, cut at a line end).
"""
import argparse
import hashlib
import json
import os
import platform
import sys
import sysconfig

from common import log, write_json

NUM_BUCKETS = 50
TEST_BUCKET = 0
VAL_BUCKET = 1
EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}
MAX_FILE_BYTES = 1 << 20  # larger .py files are generated tables (unicode data, test vectors), not code
# A site-packages file that shares this many long lines (or this fraction of them) with the held-out stdlib files is
# taken for a vendored or back-ported copy of held-out code and not trained on.
LEAK_MIN_LINE = 40
LEAK_MIN_HITS = 20
LEAK_FRACTION = 0.25


def bucket_of(rel):
    return int(hashlib.sha1(rel.encode("utf-8")).hexdigest(), 16) % NUM_BUCKETS


def list_py_files(root):
    """Sorted posix relative paths of *.py files under root, skipping site-/dist-packages and __pycache__."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        for fn in filenames:
            if fn.endswith(".py"):
                full = os.path.join(dirpath, fn)
                if os.path.islink(full) or not os.path.isfile(full):
                    continue
                out.append(os.path.relpath(full, root).replace(os.sep, "/"))
    out.sort()
    return out


def read_text(path):
    """Strict UTF-8 (a few stdlib test files are deliberately in other encodings: those are skipped)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) > MAX_FILE_BYTES:
        return None, "too_large"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not_utf8"
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        return None, "empty"
    return text, None


def significant_lines(text):
    """Hashes of the long stripped lines of a file: the fingerprint used to spot copies of held-out code."""
    out = set()
    for line in text.splitlines():
        t = line.strip()
        if len(t) >= LEAK_MIN_LINE:
            out.add(hashlib.sha1(t.encode("utf-8")).digest()[:8])
    return out


def looks_copied(text, heldout_lines):
    sig = significant_lines(text)
    hits = len(sig & heldout_lines)
    return hits >= LEAK_MIN_HITS or (hits >= 5 and hits >= LEAK_FRACTION * len(sig))


def site_roots():
    roots = []
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p and os.path.isdir(p):
            p = os.path.realpath(p)
            if p not in roots:
                roots.append(p)
    return roots


def heldout_fixture(test_docs, lo=20000, target=32000, hi=48000):
    """Whole held-out stdlib files in sorted path order while they fit under `hi` bytes; the first one that does not
    fit is cut at a line end near `target`, and that ends the fixture."""
    parts, size, used = [], 0, []
    for d in test_docs:
        if d["src"] != "stdlib":
            continue
        t = d["text"] if d["text"].endswith("\n") else d["text"] + "\n"
        b = len(t.encode("utf-8"))
        if size + b <= hi:
            parts.append(t)
            size += b
            used.append({"path": d["path"], "part": "whole"})
        else:
            cut, acc = [], 0
            for line in t.splitlines(keepends=True):
                lb = len(line.encode("utf-8"))
                if size + acc + lb > max(target, size):
                    break
                cut.append(line)
                acc += lb
            if cut:
                parts.append("".join(cut))
                size += acc
                used.append({"path": d["path"], "part": f"first {len(cut)} lines"})
            break
        if size >= target:
            break
    text = "".join(parts)
    if len(text.encode("utf-8")) < min(lo, sum(len(d["text"]) for d in test_docs)):
        raise SystemExit("held-out set too small for the fixture")
    return text, used


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", choices=["stdlib", "stdlib+site"], default="stdlib")
    ap.add_argument("--max-site-mb", type=float, default=150.0,
                    help="cap on site-packages training text (files taken in sha1(path) order up to the cap)")
    ap.add_argument("--max-train-mb", type=float, default=0.0, help="cap on all training text (0 = none; --smoke)")
    ap.add_argument("--max-eval-mb", type=float, default=0.0, help="cap on val and test text each (0 = none)")
    args = ap.parse_args()

    work = os.path.join(args.out, "work")
    fixtures = os.path.join(args.out, "fixtures")
    os.makedirs(work, exist_ok=True)
    os.makedirs(fixtures, exist_ok=True)

    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    roots = [("stdlib", stdlib)]
    if args.corpus == "stdlib+site":
        for r in site_roots():
            if r != stdlib:
                roots.append(("site", r))

    seen_content = {}
    splits = {"train": [], "val": [], "test": []}
    skipped = []
    dup = []
    leaks = []
    heldout_lines = None
    scanned = {}
    site_taken = 0
    for src, root in roots:
        files = list_py_files(root)
        scanned[src] = scanned.get(src, 0) + len(files)
        if src == "site":
            # Deterministic, package-independent subsample: files in sha1(path) order until the cap (shared by all
            # site roots) is reached; buckets 0/1 are never used. Only what is taken is read.
            files = sorted((f for f in files if bucket_of(f) not in (TEST_BUCKET, VAL_BUCKET)),
                           key=lambda f: hashlib.sha1(f.encode()).hexdigest())
            if heldout_lines is None:
                heldout_lines = set()
                for d in splits["test"] + splits["val"]:
                    heldout_lines |= significant_lines(d["text"])
        taken = []
        for rel in files:
            text, why = read_text(os.path.join(root, rel))
            if text is None:
                skipped.append({"src": src, "path": rel, "why": why})
                continue
            h = hashlib.sha1(text.encode("utf-8")).hexdigest()
            if h in seen_content:
                dup.append({"src": src, "path": rel, "same_as": seen_content[h]})
                continue
            doc = {"src": src, "path": rel, "text": text}
            if src == "stdlib":
                seen_content[h] = f"{src}:{rel}"
                b = bucket_of(rel)
                split = "test" if b == TEST_BUCKET else "val" if b == VAL_BUCKET else "train"
                splits[split].append(doc)
                continue
            if looks_copied(text, heldout_lines):
                leaks.append(rel)
                continue
            nbytes = len(text.encode("utf-8"))
            if site_taken + nbytes > args.max_site_mb * 1e6:
                break
            seen_content[h] = f"{src}:{rel}"
            site_taken += nbytes
            taken.append(doc)
        if src == "site":
            taken.sort(key=lambda d: d["path"])
            log(f"site-packages {root}: {len(taken)} of {len(files)} candidate files, "
                f"{sum(len(d['text'].encode('utf-8')) for d in taken) / 1e6:.1f} MB "
                f"({len(leaks)} dropped so far as copies of held-out code)")
            splits["train"].extend(taken)

    def cap_docs(docs, mb):
        if mb <= 0:
            return docs
        keyed = sorted(docs, key=lambda d: hashlib.sha1((d["src"] + d["path"]).encode()).hexdigest())
        out, size = [], 0
        for d in keyed:
            b = len(d["text"].encode("utf-8"))
            if size + b > mb * 1e6 and out:
                continue
            out.append(d)
            size += b
        return sorted(out, key=lambda d: (d["src"] != "stdlib", d["path"]))

    splits["train"] = cap_docs(splits["train"], args.max_train_mb)
    splits["val"] = cap_docs(splits["val"], args.max_eval_mb)
    splits["test"] = cap_docs(splits["test"], args.max_eval_mb)

    stats = {}
    for name, docs in splits.items():
        with open(os.path.join(work, f"docs_{name}.jsonl"), "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        by_src = {}
        for d in docs:
            s = by_src.setdefault(d["src"], {"files": 0, "bytes": 0})
            s["files"] += 1
            s["bytes"] += len(d["text"].encode("utf-8"))
        stats[name] = by_src

    text, used = heldout_fixture(splits["test"])
    with open(os.path.join(fixtures, "heldout.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(text)

    manifest = {
        "python_version": sys.version,
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "corpus": args.corpus,
        "roots": {src: root for src, root in roots},
        "file_rule": "*.py under each root, excluding site-packages/, dist-packages/, __pycache__/, symlinks, "
                     f"files > {MAX_FILE_BYTES} bytes, non-UTF-8 and empty files; exact-duplicate contents kept once",
        "split_rule": f"bucket = int(sha1(relative posix path).hexdigest(), 16) % {NUM_BUCKETS}; "
                      f"stdlib bucket {TEST_BUCKET} = test (held out), bucket {VAL_BUCKET} = val (checkpoint "
                      "selection), others train; site-packages files in buckets 0/1 are not used, nor site files "
                      f"sharing >= {LEAK_MIN_HITS} (or >= {LEAK_FRACTION:.0%}, min 5) distinct stripped lines of "
                      f">= {LEAK_MIN_LINE} chars with the test+val files; train_files.txt lists the training files",
        "caps": {"max_site_mb": args.max_site_mb if args.corpus == "stdlib+site" else None,
                 "max_train_mb": args.max_train_mb or None, "max_eval_mb": args.max_eval_mb or None},
        "scanned_files": scanned,
        "splits": stats,
        "skipped": skipped,
        "duplicates_dropped": len(dup),
        "site_files_dropped_as_heldout_copies": leaks,
        "test_files": [d["path"] for d in splits["test"]],
        "val_files": [d["path"] for d in splits["val"]],
        "heldout_fixture": {"bytes": len(text.encode("utf-8")), "from": used},
        "train_list_sha256": hashlib.sha256(
            "\n".join(f"{d['src']}:{d['path']}" for d in splits["train"]).encode()).hexdigest(),
    }
    write_json(os.path.join(args.out, "data_manifest.json"), manifest)
    with open(os.path.join(args.out, "train_files.txt"), "w", encoding="utf-8") as f:
        for d in splits["train"]:
            f.write(f"{d['src']}:{d['path']}\n")
    for name in ("train", "val", "test"):
        s = stats[name]
        log(f"{name}: " + ", ".join(f"{k} {v['files']} files {v['bytes'] / 1e6:.2f} MB" for k, v in s.items()))
    log(f"skipped {len(skipped)}, duplicates {len(dup)}, heldout.txt {len(text.encode('utf-8'))} bytes")


if __name__ == "__main__":
    main()
