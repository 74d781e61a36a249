"""A first run as the README tells it: the default model (models/house, no --model) served as
`scripts/run.sh` serves it, the README's examples run as written and print what the README shows, chat works
out of the box (thinking off by default for a model not trained to think; a default max_tokens on the CPU),
with curl, the `openai` client and the `ollama` client."""
import os
import re
import subprocess
import sys

import ollama
import pytest

from conftest import Server

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
README = os.path.join(ROOT, "README.md")


@pytest.fixture(scope="module")
def house():
    # No --model: the built-in default, as `scripts/run.sh` (`deltaflow serve`) runs it; port 0 instead of 8000.
    s = Server(None, "--quiet", api_key=None, served_name=None)
    yield s
    s.stop()


def readme_examples():
    """(command, expected output) pairs from the README's ```console blocks: a command starts with "$ ",
    goes on over lines ending in a backslash, inside single quotes and through a here-document, and its output
    follows."""
    text = open(README).read()
    out = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        lines = block.split("\n")
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                i += 1
                continue
            cmd = [lines[i][2:]]
            heredoc = re.search(r"<<'?(\w+)'?", lines[i])
            i += 1
            # Go on over a backslash, an open single quote, and a here-document.
            while i < len(lines) and (cmd[-1].endswith("\\") or "\n".join(cmd).count("'") % 2 or heredoc):
                cmd.append(lines[i])
                if heredoc and lines[i] == heredoc.group(1):
                    heredoc = None
                i += 1
            expected = []
            while i < len(lines) and not lines[i].startswith("$ "):
                expected.append(lines[i])
                i += 1
            out.append(("\n".join(cmd), "\n".join(expected).rstrip("\n")))
    return out


def test_readme_has_examples():
    assert len(readme_examples()) >= 5


@pytest.mark.parametrize("cmd,expected", readme_examples(), ids=lambda x: x.split("\n")[0][:40])
def test_readme_example_prints_what_the_readme_shows(house, cmd, expected):
    cmd = cmd.replace("http://127.0.0.1:8000", house.url)
    # `python3` in an example is this interpreter (the one with the `openai` package).
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    p = subprocess.run(["bash", "-c", "set -o pipefail\n" + cmd], capture_output=True, text=True, timeout=120,
                       env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.rstrip("\n") == expected, "README example:\n%s" % cmd


def test_thinking_is_off_by_default_for_the_house_model(house):
    # The house model says so in generation_config.json (it never saw a conversation); the reply is content.
    r = house.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                                            "temperature": 0})
    m = r.json()["choices"][0]["message"]
    assert m["content"] and m["reasoning_content"] is None
    prompt = house.post("/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]
    text = house.post("/detokenize", {"tokens": prompt}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # Asked for, thinking still works.
    on = house.post("/tokenize", {"messages": [{"role": "user", "content": "hi"}],
                                  "chat_template_kwargs": {"enable_thinking": True}}).json()["tokens"]
    assert house.post("/detokenize", {"tokens": on}).json()["prompt"].endswith("assistant\n<think>\n")
    assert any("thinking off" in line for line in house.log)


def test_default_max_tokens_on_the_cpu(house):
    # "hi" without max_tokens ends within the CPU default, not at the end of the context.
    r = house.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": 0,
                                            "ignore_eos": True}).json()
    assert r["usage"]["completion_tokens"] == 512 and r["choices"][0]["finish_reason"] == "length"


def test_ollama_client_first_run(house):
    c = ollama.Client(host=house.url)
    r = c.chat(model="house", messages=[{"role": "user", "content": "hi"}], options={"temperature": 0,
                                                                                     "num_predict": 8})
    assert r.message.content and not r.message.thinking
    r = c.generate(model="house", prompt="import os\n", options={"temperature": 0, "num_predict": 8})
    assert r.response and r.eval_count == 8


def test_thinking_default_flag_and_rule(start_server, model_dir):
    # The tiny checkpoint's generation_config says nothing and its template is Qwen3.5's: thinking on.
    s = start_server()
    assert any("thinking on" in line for line in s.log)
    s = start_server("--default-enable-thinking", "false", "--default-max-tokens", "7")
    assert any("thinking off" in line and "max_tokens 7" in line for line in s.log)
