"""Speculative decoding through the server (--speculative-tokens): the official openai client gets exactly the
answers of a server without it (greedy and seeded sampling, n > 1, logprobs, a stop string, streaming), and
/metrics counts the drafted and accepted tokens by draft position. The default model's MTP head is trained, so
most drafts are accepted."""
import os

from conftest import MODEL
from test_metrics import parse

HOUSE = os.path.join(os.environ.get("DF_SOURCE_DIR", ""), "models", "house")


def answers(client):
    out = []
    msgs = [{"role": "user", "content": "Tell me about the history of the city and its old harbour."}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=48, temperature=0, logprobs=True,
                                       top_logprobs=2)
    out.append((r.choices[0].message.content, [t.logprob for t in r.choices[0].logprobs.content],
                r.usage.completion_tokens))
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=40, temperature=0.8, seed=11, n=2)
    out.append([c.message.content for c in r.choices])
    r = client.completions.create(model=MODEL, prompt="The river runs through the", max_tokens=40, temperature=0,
                                  stop=["harbour"])
    out.append((r.choices[0].text, r.choices[0].finish_reason))
    stream = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=32, temperature=0.5, seed=3,
                                            stream=True)
    out.append("".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices))
    return out


def test_speculative_answers_equal_plain_ones(start_server):
    plain = start_server(model=HOUSE)
    spec = start_server("--speculative-tokens", "3", model=HOUSE)
    want = answers(plain.openai())
    got = answers(spec.openai())
    assert got == want
    m = parse(spec.get("/metrics").text)
    drafted = sum(v for k, v in m.items() if k.startswith("deltaflow_spec_decode_draft_tokens_total{"))
    accepted = sum(v for k, v in m.items() if k.startswith("deltaflow_spec_decode_accepted_tokens_total{"))
    assert drafted > 0 and accepted > 0.3 * drafted, (drafted, accepted)
    assert m['deltaflow_spec_decode_draft_tokens_total{position="1"}'] >= \
        m['deltaflow_spec_decode_accepted_tokens_total{position="1"}']


def test_speculative_tokens_on_a_model_without_a_head_is_a_clear_error(tmp_path):
    import subprocess
    from conftest import deltaflow_bin
    d = tmp_path / "vl"
    subprocess.run([deltaflow_bin(), "make-tiny", "--preset", "vl", "--out", str(d)], check=True)
    r = subprocess.run([deltaflow_bin(), "generate", "--model", str(d), "--prompt-ids", "1,2", "--speculative-tokens",
                        "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "MTP head" in r.stderr and r.stderr.count("\n") == 1, r.stderr
