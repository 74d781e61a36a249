#!/usr/bin/env python3
"""Chat-template goldens: conversations rendered by transformers' own `apply_chat_template`.

For each template (Qwen3.5, the Unsloth-modified Qwen3.6, and the Qwen3 template shipped in
shared/data/qwen3-tokenizer/tokenizer_config.json) every conversation below is rendered with
`tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False, **kwargs)`
using the Qwen3 tokenizer directory (its special tokens are passed to the template as HF does).

Run:  /opt/refvenv/bin/python tools/reference/chat_goldens.py [SHARED_DATA_DIR]
      (or python3 on the GPU machine; SHARED_DATA_DIR defaults to $DF_SHARED_DATA, else ../shared/data next to
      the repo). Without that directory (e.g. on the GPU machine) the templates and special tokens embedded in
      the committed goldens are re-rendered through transformers' render_jinja_template, wrapped exactly as
      apply_chat_template wraps it (see apply_like_tokenizer), so the output can be compared byte for byte.
Writes tests/fixtures/chat_goldens/<template>.json:
  {"template": <source text>, "template_sha256", "special_tokens": {...}, "cases": [
     {"name", "messages", "tools" (null = not passed), "add_generation_prompt", "kwargs",
      ["continue_final_message"], "expected" | "error": {"type", "message"}} ]}
"""
import copy
import hashlib
import json
import os
import sys

import jinja2
import transformers
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web — returns «snippets» (UTF-8 kept).",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "number", "default": 3.5}}},
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


def tc(name, arguments, with_function=True, call_id=None):
    fn = {"name": name, "arguments": arguments}
    out = {"type": "function", "function": fn} if with_function else dict(fn)
    if call_id is not None:
        out["id"] = call_id
    return out


U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c, **kw: dict({"role": "assistant", "content": c}, **kw)  # noqa: E731
SYS = lambda c: {"role": "system", "content": c}  # noqa: E731
T = lambda c, **kw: dict({"role": "tool", "content": c}, **kw)  # noqa: E731

CASES = []


def C(name, messages, tools=None, add_generation_prompt=True, continue_final_message=None, **kwargs):
    case = {"name": name, "messages": messages, "tools": tools,
            "add_generation_prompt": add_generation_prompt, "kwargs": kwargs}
    if continue_final_message is not None:
        case["continue_final_message"] = continue_final_message
    CASES.append(case)


IMG = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
IMG2 = {"type": "image", "image": "file:///tmp/dog.jpg"}
VID = {"type": "video", "video": "file:///tmp/clip.mp4"}
TXT = lambda t: {"type": "text", "text": t}  # noqa: E731

C("single_user", [U("Hello!")])
C("single_user_no_generation_prompt", [U("Hello!")], add_generation_prompt=False)
C("system_user", [SYS("You are a helpful assistant."), U("What is 2+2?")])
C("thinking_off", [SYS("Be brief."), U("What is 2+2?")], enable_thinking=False)
C("thinking_on_explicit", [U("What is 2+2?")], enable_thinking=True)
C("multi_turn", [SYS("sys"), U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")])
C("multi_turn_thinking_off", [U("Hi"), A("Hello!"), U("Bye")], enable_thinking=False)
C("reasoning_content_after_last_user", [U("Solve x+1=2"), A("x = 1", reasoning_content="Subtract 1 from both sides.")],
  add_generation_prompt=False)
C("reasoning_content_before_last_user", [U("q1"), A("a1", reasoning_content="r1"), U("q2")])
C("reasoning_inside_content", [U("q1"), A("<think>\nhidden steps\n</think>\n\nvisible answer")], add_generation_prompt=False)
C("reasoning_inside_content_old_turn", [U("q1"), A("<think>\nold steps\n</think>\n\nold answer"), U("q2")])
C("reasoning_content_empty", [U("q"), A("a", reasoning_content="")], add_generation_prompt=False)
C("reasoning_content_none", [U("q"), A("a", reasoning_content=None)], add_generation_prompt=False)
C("whitespace_trimmed", [SYS("  padded system  \n"), U("\n  padded user \n"), A("  padded answer  ")], add_generation_prompt=False)
C("tools_user", [U("Weather in Paris?")], tools=TOOLS)
C("tools_system_user", [SYS("You can use tools."), U("Weather in Paris?")], tools=TOOLS)
C("tools_empty_list", [U("hi")], tools=[])
C("tool_call_object_args", [
    U("Weather in Paris?"),
    A("", tool_calls=[tc("get_weather", {"city": "Paris", "unit": "celsius"}, call_id="call_1")]),
    T('{"temp": 21, "sky": "clear"}', tool_call_id="call_1"),
], tools=TOOLS)
C("tool_call_string_args", [
    U("Weather in Paris?"),
    A("", tool_calls=[tc("get_weather", '{"city": "Paris", "days": 2}')]),
    T("sunny"),
], tools=TOOLS)
C("tool_call_with_content", [
    U("Weather in Paris and Rome?"),
    A("Let me check both cities.", tool_calls=[tc("get_weather", {"city": "Paris"}), tc("get_weather", {"city": "Rome"})]),
    T("Paris: 21C"), T("Rome: 25C"),
], tools=TOOLS)
C("tool_results_three_in_a_row", [
    U("Three searches please"),
    A(None, tool_calls=[tc("search", {"query": "a"}), tc("search", {"query": "b"}), tc("search", {"query": "c"})]),
    T("result a"), T("result b"), T("result c"),
    A("Done: a, b, c."),
    U("thanks"),
], tools=TOOLS)
C("tool_call_nested_values", [
    U("complex"),
    A("", tool_calls=[tc("search", {"query": "q \"quoted\" ü", "top_k": 5, "weights": [0.5, 1.0, 2],
                                   "filters": {"lang": "en", "safe": True}, "extra": None, "flag": False, "ratio": 0.1})]),
    T("ok"),
], tools=TOOLS, add_generation_prompt=False)
C("tool_call_without_function_wrapper", [
    U("Weather?"),
    A("", tool_calls=[tc("get_weather", {"city": "Oslo"}, with_function=False)]),
    T("cold"),
], tools=TOOLS)
C("multi_step_tools", [
    SYS("agent"),
    U("Plan a trip"),
    A("", tool_calls=[tc("get_weather", {"city": "Paris"})], reasoning_content="Need weather first."),
    T("rainy"),
    A("", tool_calls=[tc("search", {"query": "indoor museums Paris"})], reasoning_content="Rain, so museums."),
    T("Louvre, Orsay"),
], tools=TOOLS)
C("multi_step_tools_final_answer", [
    U("Plan a trip"),
    A("", tool_calls=[tc("get_weather", {"city": "Paris"})], reasoning_content="Need weather."),
    T("rainy"),
    A("Visit the Louvre.", reasoning_content="Rain means indoor."),
], tools=TOOLS, add_generation_prompt=False)
C("tool_response_lookalike_user", [U("<tool_response>\nfake\n</tool_response>"), A("ok"), U("real question")])
C("images_in_content", [U([IMG, TXT("What is in this picture?")])])
C("images_two_kinds_and_text", [U([TXT("Compare "), IMG, TXT(" and "), IMG2, TXT(".")])])
C("images_with_vision_id", [U([IMG, IMG2, TXT("Which is cuter?")]), A("The cat."), U([IMG, TXT("And this?")])], add_vision_id=True)
C("video_in_content", [U([VID, TXT("Describe the clip.")])])
C("system_content_list_text", [SYS([TXT("You are "), TXT("terse.")]), U("hi")])
C("system_content_with_image_raises", [SYS([IMG, TXT("x")]), U("hi")])
C("system_not_first_raises", [U("hi"), SYS("late system"), U("again")])
C("no_user_query_raises", [SYS("only system"), A("hello")])
C("only_tool_responses_raises", [T("orphan result")])
C("unexpected_role_raises", [U("hi"), {"role": "narrator", "content": "Once upon a time"}])
C("unexpected_content_item_raises", [U([{"type": "audio", "audio": "x.wav"}])])
C("unexpected_content_type_raises", [U(42)])
C("developer_role", [{"role": "developer", "content": "Developer rules."}, U("hi")])
C("two_system_messages", [SYS("first"), SYS("second"), U("hi")])
C("preserve_thinking_true", [U("q1"), A("a1", reasoning_content="r1"), U("q2"), A("a2", reasoning_content="r2")],
  add_generation_prompt=False, preserve_thinking=True)
C("preserve_thinking_false", [U("q1"), A("a1", reasoning_content="r1"), U("q2"), A("a2", reasoning_content="r2")],
  add_generation_prompt=False, preserve_thinking=False)
C("unicode_and_special_text", [U("emoji 👩‍👩‍👧 CJK 漢字 RTL עברית and literal <|im_end|> <think> text"), A("réponse ✓")], add_generation_prompt=False)
C("custom_kwargs_ignored", [U("hi")], custom_flag=True, some_string="x")
C("assistant_last_with_tool_call_no_prompt", [
    U("Weather?"), A("Checking.", tool_calls=[tc("get_weather", {"city": "Lima", "days": 3})]),
], tools=TOOLS, add_generation_prompt=False)
C("empty_conversation_raises", [])
C("content_none_user", [U(None)])
C("continue_final_message", [U("Write a haiku"), A("Autumn moon rises")], add_generation_prompt=False,
  continue_final_message=True)
C("continue_final_message_parts", [U("Describe"), A([TXT("It is "), TXT("a cat")])], add_generation_prompt=False,
  continue_final_message=True)
C("continue_final_message_with_generation_prompt_raises", [U("q"), A("a")], add_generation_prompt=True,
  continue_final_message=True)


def load_templates(data_dir):
    out = []
    tdir = os.path.join(data_dir, "templates")
    for fname, key in (("qwen3.5-35b-a3b.chat_template.jinja", "qwen3.5"),
                       ("qwen3.6-35b-a3b.UNSLOTH-MODIFIED.chat_template.jinja", "qwen3.6-unsloth")):
        with open(os.path.join(tdir, fname), encoding="utf-8") as f:
            out.append((key, f.read(), f"shared/data/templates/{fname}"))
    with open(os.path.join(data_dir, "qwen3-tokenizer", "tokenizer_config.json"), encoding="utf-8") as f:
        out.append(("qwen3", json.load(f)["chat_template"], "shared/data/qwen3-tokenizer/tokenizer_config.json"))
    return out


def apply_like_tokenizer(special_tokens, messages, tools=None, add_generation_prompt=False, tokenize=False,
                         chat_template=None, continue_final_message=False, **kwargs):
    """transformers 5.17 PreTrainedTokenizerBase.apply_chat_template(tokenize=False) for one conversation."""
    assert not tokenize
    if isinstance(messages, (list, tuple)) and len(messages) == 0:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you "
            "want the model to continue the final message, and add_generation_prompt when you want to add a header "
            "that will prompt it to start a new assistant message instead.")
    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, documents=None,
                                        chat_template=chat_template, continue_final_message=continue_final_message,
                                        add_generation_prompt=add_generation_prompt, **{**special_tokens, **kwargs})
    return rendered[0]


class EmbeddedTokenizer:
    """Stands in for the Qwen3 tokenizer when shared/data is absent: same special tokens, same rendering path."""

    def __init__(self, special_tokens):
        self.special_tokens_map = dict(special_tokens)

    def apply_chat_template(self, messages, **kw):
        return apply_like_tokenizer(self.special_tokens_map, messages, **kw)


def render(tok, template, case):
    messages = copy.deepcopy(case["messages"])
    try:
        text = tok.apply_chat_template(messages, tools=copy.deepcopy(case["tools"]),
                                       add_generation_prompt=case["add_generation_prompt"], tokenize=False,
                                       chat_template=template,
                                       continue_final_message=case.get("continue_final_message", False),
                                       **case["kwargs"])
        assert messages == case["messages"], "template mutated its input"
        return {"expected": text}
    except Exception as e:
        msg = e.message if isinstance(e, jinja2.TemplateError) and e.message is not None else str(e)
        return {"error": {"type": type(e).__name__, "message": msg}}


def embedded_templates(out_dir):
    out = []
    for key in ("qwen3.5", "qwen3.6-unsloth", "qwen3"):
        with open(os.path.join(out_dir, f"{key}.json"), encoding="utf-8") as f:
            doc = json.load(f)
        out.append((key, doc["template"], doc["template_source"], doc["special_tokens"]))
    return out


def main():
    data_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "DF_SHARED_DATA", os.path.normpath(os.path.join(REPO, "..", "shared", "data")))
    out_dir = os.path.join(REPO, "tests", "fixtures", "chat_goldens")
    os.makedirs(out_dir, exist_ok=True)
    if os.path.isdir(os.path.join(data_dir, "qwen3-tokenizer")):
        tok = AutoTokenizer.from_pretrained(os.path.join(data_dir, "qwen3-tokenizer"))
        sources = [(k, t, s, None) for k, t, s in load_templates(data_dir)]
    else:
        print(f"{data_dir} not found: re-rendering the templates embedded in {out_dir}")
        tok = None
        sources = embedded_templates(out_dir)
    for key, template, source, special in sources:
        tok_here = tok if tok is not None else EmbeddedTokenizer(special)
        cases = []
        for case in CASES:
            c = copy.deepcopy(case)
            c.update(render(tok_here, template, case))
            cases.append(c)
        doc = {
            "generator": "tools/reference/chat_goldens.py",
            "transformers": transformers.__version__,
            "jinja2": jinja2.__version__,
            "template_source": source,
            "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
            "template": template,
            "special_tokens": tok_here.special_tokens_map,
            "cases": cases,
        }
        path = os.path.join(out_dir, f"{key}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_err = sum(1 for c in cases if "error" in c)
        print(f"{key}: {len(cases)} conversations ({n_err} raise) -> {path}")


if __name__ == "__main__":
    main()
