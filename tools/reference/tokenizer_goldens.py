#!/usr/bin/env python3
"""Golden token ids from the Hugging Face `tokenizers` library, for tests/unit/text_tokenizer_test.cpp.

For each tokenizer variant this writes tests/fixtures/tokenizer_goldens/<variant>.json:
  {"variant", "tokenizers_version", "tokenizer": path of tokenizer.json (relative to the repository root),
   "config": path of tokenizer_config.json or null, "derive": how the test builds the tokenizer from that file
   (null, or {"split_pattern": P}: replace the Split regex of the first pre-tokenizer step),
   "vocab_size", "special_ids", "token_ids": {token: id},
   "cases": [{"text" | "bytes_hex", "ids", "decoded", "decoded_skip"}],
   "decode": [{"ids", "skip_special_tokens", "text"}]}
ids = Tokenizer.encode(text, add_special_tokens=False).ids; decoded = decode(ids, skip_special_tokens=False);
decoded_skip = the same with True. A "bytes_hex" case is invalid UTF-8: the reference encodes
bytes.decode("utf-8", "replace"), which is what our tokenizer does with such input.

Variants:
  qwen3               the real Qwen3 tokenizer (tests/fixtures/tokenizers/qwen3)
  qwen3-qwen35-regex  the same vocabulary with Qwen3.5's pre-tokenizer regex (derived at test time)
  tiny                assets/tiny-tokenizer (the tokenizer of tiny checkpoints)
  tiny-flags          tiny plus added tokens exercising lstrip / rstrip / single_word / normalized / special
  tiny-gpt2           tiny's vocabulary as a GPT-2 style tokenizer: plain ByteLevel pre-tokenizer with
                      add_prefix_space and its own regex, merges in the legacy "a b" form, ignore_merges,
                      normalizer Sequence[NFC], no added tokens
  tiny-splits         tiny's vocabulary behind Split pre-tokenizers with every delimiter behaviour, a literal
                      pattern and invert
The tiny-* derived files are small and written to tests/fixtures/tokenizers/<variant>/tokenizer.json.

Usage (from the repository root; tokenizers 0.23.2 as on the GPU machine):
  python tools/reference/tokenizer_goldens.py [--root .]
"""

import argparse
import copy
import json
import os
import random
import zlib

import tokenizers
from tokenizers import Tokenizer

QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def hard_strings():
    """Hand-written hard cases, grouped by what they probe."""
    s = []
    # Empty, whitespace, newlines, tabs, CRLF.
    s += ["", " ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n", "\n\n\n", " \n", "\n ", " \n ", "\t\t\tx",
          "a\tb", "a \tb", "a\t b", "x\r\ny", "x\r\n\r\ny", "x\n\r\ny", "line1\nline2\n", "  leading", "trailing  ",
          "a  b", "a   b", "a    b", "a\u00a0b", "a\u2003b", "a\u3000b", "\u3000\u3000x", "x\u2028y", "x\u2029y",
          "x\u0085y", "x\u180ey", "x\u200by", "x\ufeffy", "x\x0bz\x0cw", " " * 17 + "x", "\n" * 9 + "x",
          "\t \n \t\n", "end with space ", "end with newline\n", "end with spaces\n   ", "  \n\n  \n"]
    # Contractions and case.
    s += ["it's", "It'S", "IT'S", "don't", "DON'T", "we're", "WE'RE", "We'Re", "I've", "I'VE", "I'm", "I'M",
          "you'll", "YOU'LL", "he'd", "HE'D", "'s", "'S'", "''s", "' s", "it\u2019s", "it'ſ", "rock'n'roll",
          "o'clock", "'twas", "y'all'd've", "the dog's bone's", "'re're're"]
    # Digits and numbers.
    s += ["0", "7", "42", "123", "1234", "12345", "3.14159", "1,000,000", "-17", "+1e-9", "0x1F", "2024-01-31",
          "10:45pm", "v1.2.3", "1" * 50, "9876543210" * 5, "a1b2c3", "x²+y³", "٣٤٥", "१२३", "①②③", "Ⅻ",
          "½ cup", "１２３", "100%", "$9.99", "€5", "¥1000"]
    # CJK, Japanese, Korean.
    s += ["你好", "你好，世界！", "我爱北京天安门。", "中文 English 混合", "日本語のテキストです。", "ひらがな カタカナ",
          "ｶﾀｶﾅ", "한국어 텍스트", "안녕하세요", "漢字かなカナ", "「引用」『二重』", "、。・ー", "𠀀𠀁𪚥",
          "龍龘", "中文\n换行", "数字123汉字"]
    # Emoji: ZWJ sequences, skin tones, flags, keycaps, variation selectors.
    s += ["😀", "😀😀", "👍", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️", "🇺🇸", "🇯🇵🇰🇷", "1️⃣", "#️⃣", "❤️",
          "❤\ufe0e", "☺️", "🤷‍♀️", "🧑🏻‍🤝‍🧑🏿", "hello 👋 world", "emoji😀in😀text", "🎉🎉🎉", "🫠🫶", "🏻", "\u200d",
          "a\u200db", "👨\u200d", "\u200d👨"]
    # Combining marks (Qwen3.5's regex adds \p{M} next to \p{L}).
    s += ["e\u0301", "cafe\u0301", "café", "naïve", "nai\u0308ve", "Å", "A\u030a", "\u0301", "\u0301\u0301a",
          "a\u0301\u0302\u0303", "x\u0323\u0307", "ṩ", "s\u0323\u0307", "s\u0307\u0323", "Z̴̡̢͇͙a̸l̷g̵o̶", "a \u0301b",
          "1\u0301", "!\u0301", "\u0301!", "e\u0301\u0301\u0301\u0301", "ﬁ", "ǅ", "ᾅ", "ố", "Việt Nam", "Tiếng Việt",
          "\u20dd", "a\u20dd", "\u0e31", "क\u093c", "ক্ষ"]
    # RTL: Arabic and Hebrew, with marks and digits.
    s += ["مرحبا بالعالم", "العربية", "كَتَبَ", "ﷺ", "שלום עולם", "עִבְרִית", "abc עברית def", "مرحبا123",
          "\u202eevil\u202c", "\u200fRTL\u200e", "فارسی", "اردو"]
    # Indic, Thai and other scripts.
    s += ["नमस्ते दुनिया", "हिन्दी", "क्षत्रिय", "ਪੰਜਾਬੀ", "தமிழ்", "తెలుగు", "ಕನ್ನಡ", "മലയാളം", "বাংলা", "ภาษาไทย",
          "สวัสดีครับ", "ພາສາລາວ", "ខ្មែរ", "မြန်မာ", "ᐃᓄᒃᑎᑐᑦ", "ქართული", "Հայերեն", "አማርኛ", "ελληνικά", "Ελληνικά",
          "русский текст", "Українська", "Ёлка", "Tiếng Việt có dấu", "Türkçe İıŞş", "Straße", "STRASSE", "ŁÓDŹ",
          "Ænima", "Ça va", "ﬀ ﬃ", "ꝏ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝐁𝐨𝐥𝐝", "ℌ𝔢𝔩𝔩𝔬", "Ω≈ç√∫"]
    # Code in several languages.
    s += [
        "def f(x):\n    return x ** 2\n",
        "import numpy as np\nprint(np.arange(10).reshape(2, 5))\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
        "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
        "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}\n",
        "const add = (a, b) => a + b;\nconsole.log(`sum=${add(1, 2)}`);\n",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
        "<div class=\"x\"><p>Hello &amp; welcome</p></div>",
        "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
        "x = {'a': 1}  # comment\n\n\n\ty = x['a']",
        "    if x:\n        pass\n    else:\n        raise ValueError('bad')\n",
        "$ ls -la | grep '^d' && echo \"done\"",
        "func (s *Server) Run(ctx context.Context) error {\n\treturn nil\n}",
        "public static void main(String[] args) { System.out.println(\"hi\"); }",
        "a<=b>=c!=d==e&&f||g",
        "x+=1;y-=2;z*=3;w/=4;",
        "   \n\n    code after blank lines",
        "https://example.com/path?q=1&r=two#frag",
        "user@example.com",
        "C:\\Users\\name\\file.txt",
        "/usr/local/bin/python3",
        "// comment\n/* block */\n-- sql comment\n# shell",
        "\\begin{equation} E = mc^2 \\end{equation}",
        "\"\"\"docstring\"\"\"",
        "@decorator\nclass A(B, metaclass=M):\n    ...",
        "λx. x + 1",
        "<?php echo $x; ?>",
        "```python\nprint(1)\n```",
    ]
    # Special-token text inside content, and near misses.
    s += ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<think></think>",
          "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
          "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
          "<tool_response>ok</tool_response>", "a<|im_end|>b", " <|im_end|> ", "<|im_end|><|im_end|>",
          "<<|im_end|>>", "<|im_start", "im_start|>", "<|im_start|", "<|IM_START|>", "< |im_start| >",
          "<|vision_start|><|image_pad|><|vision_end|>", "<|fim_prefix|>def<|fim_suffix|>x<|fim_middle|>",
          "<|repo_name|>r<|file_sep|>f", "<thinking>", "<think >", "</ think>", "<|endoftext|>text after",
          "text<|endoftext|>", "<|box_start|>(1,2)<|box_end|>", "<|object_ref_start|>cat<|object_ref_end|>",
          "<|quad_start|><|quad_end|>", "<|vision_pad|><|video_pad|>", "\n<|im_start|>\n", "<think>\u0301",
          "e<|im_end|>\u0301", "<|im_start|>你好<|im_end|>", "<|extra_0|>", "<|reserved_special_token_0|>"]
    # Byte-level corner cases: characters of the GPT-2 alphabet itself, controls, rare code points.
    s += ["Ġ", "ĠĠ", "Ċ", "ĉ", "Ã©", "Â", "\x00", "a\x00b", "\x01\x02\x03", "\x7f", "\x1b[31mred\x1b[0m", "\u00ad",
          "\ufffd", "\ufffd\ufffd", "\U0010ffff", "\ue000", "\U000f0000", "\u2060", "\u034f", "\U0001f9d1"]
    # Very long words and runs.
    s += ["a" * 1000, "ab" * 700, "supercalifragilisticexpialidocious" * 40, "7" * 2000, " " * 3000, "\n" * 1500,
          "\t" * 500, "-" * 800, "😀" * 300, "中" * 1000, "e\u0301" * 400, "Ab1!" * 300,
          "pneumonoultramicroscopicsilicovolcanoconiosis", "Donaudampfschifffahrtsgesellschaftskapitän"]
    # Prose.
    s += [
        "The quick brown fox jumps over the lazy dog.",
        "Hello, world! How are you today? I'm fine, thanks.",
        "In 1492, Columbus sailed the ocean blue.",
        "She said: \"It's over.\" Then -- silence...",
        "Mr. Smith's 3rd-floor apartment (#42B) costs $1,250/month.",
        "The café served crème brûlée and jalapeño poppers.",
        "“Smart quotes” and ‘single ones’ — with an em dash – and an en dash.",
        "E = mc²; ∑ᵢ xᵢ ≥ 0; ∀x ∃y: x ≠ y.",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt.",
        "ALL CAPS SENTENCE WITH NUMBERS 123 AND SYMBOLS !@#$%^&*()",
        "...!!!???",
        "a.b.c.d",
        "end.",
        " leading space prose",
    ]
    return s


def invalid_utf8():
    """Byte strings that are not valid UTF-8."""
    return [b"\xff", b"\xfe\xff", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82x", b"\xf0\x9f\x98",
            b"\xf0\x9f\x98x", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80",
            b"ok\xe4\xbd\xa0\xe5\xa5", b"\x80\x80\x80", b"caf\xe9", b"<|im_end|>\xff<|im_end|>", b"a\xc3\xa9\xc3"]


def random_strings(seed, n):
    """Random mixtures of characters from many classes, to catch what hand-written cases miss."""
    rnd = random.Random(seed)
    pools = [
        list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"), list("0123456789"), list(" \t\n\r"),
        list("'\".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`"), ["é", "ñ", "ü", "ø", "ß", "Ω", "ж", "ğ"],
        ["\u0301", "\u0308", "\u0323", "\u064e", "\u05b0", "\u093c", "\u0e31", "\u20dd"],
        ["你", "好", "世", "界", "の", "カ", "한", "글"], ["😀", "👍", "🏽", "\u200d", "❤", "\ufe0f", "🇺", "🇸"],
        ["\u00a0", "\u3000", "\u2028", "\u0085", "\u180e", "\u200b"], ["ق", "ب", "א", "ש", "क", "ि", "ก", "ั"],
        ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "'s", "'LL"],
    ]
    out = []
    for _ in range(n):
        k = rnd.randint(1, 40)
        out.append("".join(rnd.choice(rnd.choice(pools)) for _ in range(k)))
    return out


def case(tok, text=None, raw=None):
    if raw is not None:
        text_in = raw.decode("utf-8", "replace")
    else:
        text_in = text
    ids = tok.encode(text_in, add_special_tokens=False).ids
    c = {"bytes_hex": raw.hex()} if raw is not None else {"text": text}
    c["ids"] = ids
    c["decoded"] = tok.decode(ids, skip_special_tokens=False)
    c["decoded_skip"] = tok.decode(ids, skip_special_tokens=True)
    return c


def decode_cases(tok, seed):
    """Id sequences decoded directly: random ids (often splitting UTF-8 characters), added tokens, unknown ids."""
    rnd = random.Random(seed)
    n = tok.get_vocab_size(with_added_tokens=True)
    added = sorted(tok.get_added_tokens_decoder().keys())
    seqs = [[], [n + 5], [n + 1000]]
    for _ in range(60):
        k = rnd.randint(1, 12)
        seq = []
        for _ in range(k):
            r = rnd.random()
            if r < 0.15 and added:
                seq.append(rnd.choice(added))
            elif r < 0.2:
                seq.append(n + rnd.randint(0, 100))  # unknown: skipped
            else:
                seq.append(rnd.randrange(0, n))
        seqs.append(seq)
    out = []
    for seq in seqs:
        for skip in (False, True):
            out.append({"ids": seq, "skip_special_tokens": skip, "text": tok.decode(seq, skip_special_tokens=skip)})
    return out


def write_golden(root, out_dir, variant, tok, tokenizer_path, config_path, derive, extra_texts=()):
    texts = hard_strings() + random_strings(zlib.crc32(variant.encode()), 160) + list(extra_texts)
    cases = [case(tok, text=t) for t in texts] + [case(tok, raw=b) for b in invalid_utf8()]
    added = tok.get_added_tokens_decoder()
    probe = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "Hello", "Ġthe",
             "ĠĠ", "Ċ", "a", "!", "not-a-token-xyz"]
    token_ids = {p: tok.token_to_id(p) for p in probe}
    golden = {
        "variant": variant,
        "generator": "tools/reference/tokenizer_goldens.py",
        "tokenizers_version": tokenizers.__version__,
        "tokenizer": tokenizer_path,
        "config": config_path,
        "derive": derive,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "special_ids": sorted(i for i, t in added.items() if t.special),
        "token_ids": token_ids,
        "cases": cases,
        "decode": decode_cases(tok, 7),
    }
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, variant + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {len(cases)} cases, {len(golden['decode'])} decode cases")


def write_tokenizer(root, rel_path, data):
    path = os.path.join(root, rel_path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
        f.write("\n")
    return Tokenizer.from_file(path)


def tiny_flags(tiny):
    """tiny plus added tokens with every flag; ids follow tokenizers' assignment (next free id)."""
    d = copy.deepcopy(tiny)

    def tok(content, special=False, normalized=False, lstrip=False, rstrip=False, single_word=False):
        return {"id": 0, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
                "normalized": normalized, "special": special}

    extra = [
        tok("[LS]", special=True, lstrip=True),
        tok("[RS]", rstrip=True),
        tok("[BOTH]", special=True, lstrip=True, rstrip=True),
        tok("word", single_word=True),
        tok("wörd", single_word=True, normalized=True),
        tok("café", normalized=True),            # matched after NFC, so "cafe\u0301" finds it
        tok("e\u0301x", normalized=True),        # the pattern itself is normalized to "éx"
        tok("Ġhey"),                             # decodes through the ByteLevel decoder to " hey"
        tok("<|im"),                             # shorter overlap of <|im_start|>: leftmost-longest wins
        tok("ab"), tok("abc"), tok("b"),         # overlapping non-special tokens
        tok("[NS]", special=True, normalized=True),
        tok("the"),                              # also a vocabulary token? then it keeps the vocabulary id
        tok("你好"),
        tok("  "),                               # two spaces
    ]
    d["added_tokens"] = d["added_tokens"] + extra
    t = Tokenizer.from_str(json.dumps(d))
    for e in d["added_tokens"]:
        e["id"] = t.token_to_id(e["content"])  # write the ids tokenizers assigns, for readers of the file
    return d


def tiny_gpt2(tiny):
    d = copy.deepcopy(tiny)
    d["added_tokens"] = []
    d["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}]}
    d["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    d["post_processor"] = None
    m = d["model"]
    m["merges"] = [a + " " + b for a, b in m["merges"]]
    m["ignore_merges"] = True
    # A token that merges cannot build, so ignore_merges changes the result for this word.
    m["vocab"]["Ġzqxjv"] = len(m["vocab"])
    return d


def tiny_splits(tiny):
    d = copy.deepcopy(tiny)
    d["normalizer"] = None
    d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[,;]"}, "behavior": "Removed", "invert": False},
        {"type": "Split", "pattern": {"Regex": "-+"}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Split", "pattern": {"Regex": "\\p{N}"}, "behavior": "Contiguous", "invert": True},
        {"type": "Split", "pattern": {"Regex": "^\\s*|x*"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    ]}
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="repository root")
    args = ap.parse_args()
    root = args.root
    out_dir = os.path.join(root, "tests/fixtures/tokenizer_goldens")

    q3_path = "tests/fixtures/tokenizers/qwen3/tokenizer.json"
    q3_cfg = "tests/fixtures/tokenizers/qwen3/tokenizer_config.json"
    q3 = Tokenizer.from_file(os.path.join(root, q3_path))
    write_golden(root, out_dir, "qwen3", q3, q3_path, q3_cfg, None)

    with open(os.path.join(root, q3_path), encoding="utf-8") as f:
        q35 = json.load(f)
    q35["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN35_PATTERN
    write_golden(root, out_dir, "qwen3-qwen35-regex", Tokenizer.from_str(json.dumps(q35)), q3_path, q3_cfg,
                 {"split_pattern": QWEN35_PATTERN})

    tiny_path = "assets/tiny-tokenizer/tokenizer.json"
    tiny_cfg = "assets/tiny-tokenizer/tokenizer_config.json"
    write_golden(root, out_dir, "tiny", Tokenizer.from_file(os.path.join(root, tiny_path)), tiny_path, tiny_cfg, None)
    with open(os.path.join(root, tiny_path), encoding="utf-8") as f:
        tiny = json.load(f)

    flag_texts = ["[LS]", "a [LS] b", "a   [LS]b", "a[LS]  b", "a [RS]   b", "a[RS]\n\nb", "  [BOTH]  x",
                  "x [BOTH] [BOTH] y", "[LS][LS]", " [LS] [RS] [BOTH] ", "word", "a word here", "sword", "words",
                  "word_x", "_word", "word1", "1word", "word!", "(word)", "wörd", "wo\u0308rd", "a wörd b",
                  "café", "cafe\u0301", "un café", "écafé", "éx", "e\u0301x", "e\u0301xe\u0301x", "Ġhey", " hey",
                  "<|im", "<|im_start|>", "<|im_end|>", "<|im<|im_start|>", "abc", "ab", "abcab", "bab", "aabcc",
                  "[NS]", "x[NS]y", "the", "other", "theme", "你好", "你好吗", "a  b", "   ", "\u3000[LS]", "\t[RS]\t"]
    for variant, data, texts in (("tiny-flags", tiny_flags(tiny), flag_texts),
                                 ("tiny-gpt2", tiny_gpt2(tiny), [" zqxjv", "zqxjv", "a zqxjv b", " zqxjvzqxjv"]),
                                 ("tiny-splits", tiny_splits(tiny), ["a,b;c", "a-b--c", "x1y22z", "  lead", "xx-xx",
                                                                     "a b  c   d", "1,2-3 4;;5", "-a-", ",,,"])):
        rel = f"tests/fixtures/tokenizers/{variant}/tokenizer.json"
        tok = write_tokenizer(root, rel, data)
        write_golden(root, out_dir, variant, tok, rel, None, None, texts)


if __name__ == "__main__":
    main()
