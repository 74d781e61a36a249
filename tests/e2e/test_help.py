"""Every subcommand answers --help (exit 0, on stdout) with its flags, and the flags it lists are exactly the
ones its parser accepts (the ArgSpec in src/cli/cmd_<name>.cpp); an unknown flag is one line naming it."""
import os
import re
import subprocess

import pytest

from conftest import BIN, run

SRC = os.path.join(os.path.dirname(__file__), "../../src/cli")
COMMANDS = ("batch", "bench", "chat", "eval", "generate", "inspect", "make-tiny", "quantize", "serve", "tokenize")


def engine_flags():
    """The flags add_engine_flags (src/cli/model_options.cpp) adds to a command's ArgSpec."""
    src = open(os.path.join(SRC, "model_options.cpp")).read()
    m = re.search(r"void add_engine_flags\(ArgSpec& spec\) \{(.*?)\n\}", src, re.S)
    assert m, "no add_engine_flags in model_options.cpp"
    return set(re.findall(r'"(--[a-z][a-z0-9-]*)"', m.group(1)))


def parser_flags(command):
    """The flags the command's Args::parse call accepts: the string literals of its ArgSpec, and the engine's
    flags when it calls add_engine_flags."""
    name = {"bench --requests": "bench_serving", "bench --images": "bench_images", "bench --gemv": "bench_gemv"}.get(
        command, command.replace("-", "_"))
    src = open(os.path.join(SRC, "cmd_%s.cpp" % name)).read()
    m = re.search(r"ArgSpec spec\s*\{(.*?)\};", src, re.S) or re.search(r"Args::parse\(\s*argv,\s*(\{.*?\})\);", src, re.S)
    assert m, "no ArgSpec found for " + command
    flags = set(re.findall(r'"(--[a-z][a-z0-9-]*)"', m.group(1)))
    if "add_engine_flags(spec);" in src:
        flags |= engine_flags()
    return flags


def help_flags(text):
    return set(re.findall(r"^  (--[a-z][a-z0-9-]*)", text, re.M))


def test_top_level_help_lists_every_command():
    p = run("--help")
    for c in COMMANDS:
        assert re.search(r"^  %s\s" % re.escape(c), p.stdout, re.M), c


@pytest.mark.parametrize("command", COMMANDS + ("bench --requests", "bench --images", "bench --gemv"))
@pytest.mark.parametrize("flag", ("--help", "-h"))
def test_help_lists_the_parsers_flags(command, flag):
    p = run(*command.split(), flag)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout.startswith("usage: deltaflow " + command)
    assert help_flags(p.stdout) - {"--help"} == parser_flags(command)
    lines = p.stdout.splitlines()
    for i, line in enumerate(lines):
        if not re.match(r"^  --", line):
            continue
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) == 1:  # a long flag name: its text is on the next line
            assert re.match(r"^ {20,}\S", lines[i + 1]), "flag without a description: " + line
        else:
            assert len(parts) == 2 and parts[1], "flag without a description: " + line


@pytest.mark.parametrize("command", COMMANDS)
def test_unknown_flag_is_one_line_naming_it(command):
    p = subprocess.run([BIN, command, "--no-such-flag"], capture_output=True, text=True, timeout=60)
    if command == "bench" and "no CUDA backend" in p.stderr:
        pytest.skip("bench refuses to run at all in a CPU-only build")
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown flag --no-such-flag" in lines[0], p.stderr
    assert "deltaflow %s --help" % command in lines[0]
    assert p.stdout == ""
