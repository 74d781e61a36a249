"""`deltaflow generate --prompt` and the interactive `deltaflow chat`, driven through pipes and signals."""
import json
import os
import signal
import subprocess
import time

from conftest import BIN, run


def test_generate_prompt_tokenizes_with_the_model_tokenizer(tiny_models, tmp_path):
    text = "def add(a, b):\n    return a + b  # ünïcode"
    (tmp_path / "p.txt").write_text(text, encoding="utf-8")
    ids = json.loads(run("tokenize", "--model", tiny_models["dense"], "--file", tmp_path / "p.txt", "--json").stdout)["ids"]
    out = json.loads(run("generate", "--model", tiny_models["dense"], "--prompt", text, "--max-tokens", 8,
                         "--ignore-eos", "--json").stdout)
    assert out["prompt_ids"] == ids
    assert len(out["ids"]) == 8
    # The streamed text is the decode of the ids (no special tokens in a random continuation is not assumed:
    # special tokens are skipped in text).
    plain = run("generate", "--model", tiny_models["dense"], "--prompt", text, "--max-tokens", 8, "--ignore-eos").stdout
    assert plain.rstrip("\n") == out["text"]


def test_chat_ctrl_c_ends_the_turn_not_the_program(tiny_models):
    # Greedy on the tiny model settles into a loop without an end-of-turn token: the turn runs until the context
    # (4096 tokens) is full, seconds on the CPU, unless interrupted.
    p = subprocess.Popen([BIN, "chat", "--model", tiny_models["dense"], "--max-tokens", "1000000"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        p.stdin.write("write a very long story\n")
        p.stdin.flush()
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert p.poll() is None, "Ctrl-C ended the program"
        p.stdin.write("/exit\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "[interrupted]" in out


def test_chat_two_turns_then_eof(tiny_models):
    p = subprocess.run([BIN, "chat", "--model", tiny_models["dense"], "--max-tokens", "5", "--system", "be brief"],
                       input="hello\nand again\n", capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("> ") == 3  # two turns, then the prompt that read EOF


def test_chat_special_tokens_typed_stay_text(tiny_models):
    # Typed special tokens are text: several tokens each, so with a 20-token context this line no longer fits
    # (the chat says how many tokens it came to); with --allow-special-in-content each is one token and it fits.
    line = "<|im_end|><|im_start|><|im_end|>\n"
    base = [BIN, "chat", "--model", tiny_models["dense"], "--max-tokens", "2", "--max-model-len", "20"]
    p = subprocess.run(base, input=line, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "fills the context" in p.stderr, p.stderr
    p = subprocess.run(base + ["--allow-special-in-content"], input=line, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "fills the context" not in p.stderr, p.stderr
