"""Images through `deltaflow serve` on a `make-tiny --preset vl` checkpoint: OpenAI `image_url` parts (data: URLs,
local files under --allowed-local-media-path) with the official openai client, Ollama `images` with the official
ollama client, the prefix cache across image prompts, and the 400s: http URLs, files outside the allowed folder,
bad images (truncated, unknown format, oversized, a decompression bomb), too many images, and a model without a
trained vision tower (the default model)."""
import base64
import os
import shutil
import struct
import subprocess
import zlib

import ollama
import openai
import pytest

from conftest import MODEL, Server, deltaflow_bin

IMAGES = os.path.join(os.environ.get("DF_FIXTURES", os.path.join(os.path.dirname(__file__), "..", "fixtures")),
                      "vision", "images")
HOUSE = os.path.join(os.environ.get("DF_SOURCE_DIR", ""), "models", "house")


def image_bytes(name):
    with open(os.path.join(IMAGES, name), "rb") as f:
        return f.read()


def data_url(raw, mime="image/png"):
    return "data:%s;base64,%s" % (mime, base64.b64encode(raw).decode())


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width, height):
    """An RGB PNG, written with zlib (no Pillow here)."""
    rows = b"".join(b"\0" + bytes([(x * 7 + y * 3) % 256 for x in range(width) for _ in range(3)])
                    for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def bomb():
    """A valid PNG header claiming 60000 x 60000 pixels, with almost no data."""
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    shutil.copy(os.path.join(IMAGES, "rgb_67x45.png"), d / "rgb.png")
    return str(d)


@pytest.fixture(scope="module")
def vl_server(tmp_path_factory, media):
    out = tmp_path_factory.mktemp("tiny-vl")
    subprocess.run([deltaflow_bin(), "make-tiny", "--preset", "vl", "--seed", "1", "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    s = Server(str(out), "--quiet", "--allowed-local-media-path", media, "--max-image-pixels", "100000",
               "--limit-mm-per-prompt", "2")
    yield s
    assert s.stop() == 0, "".join(s.log)


def chat(client, *urls, text="What is in the picture?", max_tokens=6):
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": text}]
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}],
                                          max_tokens=max_tokens, temperature=0, logprobs=True)


def lps(r):
    return [t.logprob for t in r.choices[0].logprobs.content]


def test_openai_image_url_data_and_local_file(vl_server, media):
    c = vl_server.openai()
    text_only = c.chat.completions.create(model=MODEL, max_tokens=1, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is in the picture?"}]}])
    a = chat(c, data_url(image_bytes("rgb_67x45.png")))
    assert a.usage.completion_tokens == 6
    # The image's tokens: <|vision_start|>, the placeholders (a 64 x 96 resize: 2 x 3 merged patches), <|vision_end|>.
    assert a.usage.prompt_tokens > text_only.usage.prompt_tokens + 2
    # The same image again: from the prefix cache, the same tokens and log-probabilities.
    again = chat(c, data_url(image_bytes("rgb_67x45.png")))
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert (again.choices[0].message.content, lps(again)) == (a.choices[0].message.content, lps(a))
    # The same image as a local file under --allowed-local-media-path, as file:// and as a path.
    for url in ("file://" + os.path.join(media, "rgb.png"), os.path.join(media, "rgb.png")):
        f = chat(c, url)
        assert (f.choices[0].message.content, lps(f)) == (a.choices[0].message.content, lps(a))
    # Another image resized to the same grid (a WebP, 50 x 34 -> 64 x 96 like 67 x 45): the same prompt ids, only
    # the image differs, so the cache serves nothing past the image and the answer is its own.
    other = chat(c, data_url(image_bytes("lossy_50x34.webp"), "image/webp"))
    assert other.usage.prompt_tokens == a.usage.prompt_tokens
    assert lps(other) != lps(a)
    assert other.usage.prompt_tokens_details.cached_tokens < text_only.usage.prompt_tokens
    two = chat(c, data_url(image_bytes("photo_80x50.jpg"), "image/jpeg"),
               data_url(image_bytes("frame_gif_40x30.gif"), "image/gif"))
    assert two.usage.completion_tokens == 6


def test_tokenize_and_prompt_logprobs_see_the_image(vl_server):
    """vLLM's /tokenize counts an image as the tokens the model sees for it, and prompt_logprobs scores the prompt
    with its image in place: a prompt that differs only in its image scores the same up to the image and not
    after it."""
    c = vl_server.openai()
    messages = lambda name, mime: [{"role": "user", "content": [  # noqa: E731
        {"type": "image_url", "image_url": {"url": data_url(image_bytes(name), mime)}},
        {"type": "text", "text": "What is in the picture?"}]}]
    a_msgs, b_msgs = messages("rgb_67x45.png", "image/png"), messages("lossy_50x34.webp", "image/webp")
    a = c.chat.completions.create(model=MODEL, messages=a_msgs, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 0})
    tok = vl_server.post("/tokenize", {"model": MODEL, "messages": a_msgs}).json()
    assert tok["count"] == a.usage.prompt_tokens == len(tok["tokens"])
    plp = a.model_extra["prompt_logprobs"]
    assert len(plp) == a.usage.prompt_tokens and plp[0] is None
    assert [int(next(iter(e))) for e in plp[1:]] == tok["tokens"][1:]  # each entry holds the prompt's token
    b = c.chat.completions.create(model=MODEL, messages=b_msgs, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 0})
    b_plp = b.model_extra["prompt_logprobs"]
    assert len(b_plp) == len(plp)  # the same grid, so the same ids
    value = lambda e: next(iter(e.values()))["logprob"]  # noqa: E731
    # Rows up to the image's first token (the first of a run of repeated placeholder ids) are predicted from the
    # text alone: the same in both. Every later row has seen its own image.
    ids = tok["tokens"]
    first_image = next(j for j in range(len(ids) - 2) if ids[j] == ids[j + 1] == ids[j + 2])
    for i in range(1, first_image + 1):
        assert value(plp[i]) == value(b_plp[i]), i
    after = range(first_image + 1, len(ids))
    assert sum(value(plp[i]) != value(b_plp[i]) for i in after) >= len(after) // 2
    # Text only: the /tokenize count of an image-free prompt is its plain token count.
    text_msgs = [{"role": "user", "content": "What is in the picture?"}]
    t = vl_server.post("/tokenize", {"model": MODEL, "messages": text_msgs}).json()
    assert t["count"] < tok["count"] - 2


def bad(c, *urls):
    with pytest.raises(openai.BadRequestError) as e:
        chat(c, *urls)
    return e.value


@pytest.mark.parametrize("url, words", [
    ("http://example.com/cat.png", "network"),
    ("https://example.com/cat.png", "network"),
    ("/etc/passwd", "allowed-local-media-path"),
    ("file:///etc/hostname", "allowed-local-media-path"),
    ("relative/cat.png", "absolute path"),
    ("data:image/png;base64,%%%not-base64", "base64"),
    ("data:image/png,plain", "base64"),
    (data_url(image_bytes("rgb_67x45.png")[:200]), "bad image"),          # truncated
    (data_url(b"GIF89a-not-really" + b"\0" * 64), "bad image"),           # broken
    (data_url(b"this is not an image at all, just text"), "bad image"),   # unknown format
    (data_url(png(400, 300)), "bad image"),                                # 120000 > --max-image-pixels 100000
    (data_url(bomb()), "bad image"),                                       # decompression bomb
])
def test_bad_images_are_400(vl_server, url, words):
    e = bad(vl_server.openai(), url)
    body = e.response.json()["error"]
    assert words in body["message"], body
    assert body["type"] == "invalid_request_error"
    assert body["param"].startswith("messages[0].content[0].image_url"), body


def test_too_many_images_and_the_server_stays_up(vl_server):
    u = data_url(image_bytes("rgb_67x45.png"))
    e = bad(vl_server.openai(), u, u, u)
    assert "--limit-mm-per-prompt 2" in e.response.json()["error"]["message"]
    assert vl_server.get("/health").status_code == 200
    assert chat(vl_server.openai(), u).usage.completion_tokens == 6


def test_ollama_chat_and_generate_images(vl_server):
    oc = ollama.Client(host=vl_server.url, headers=vl_server.headers(), timeout=60)
    raw = image_bytes("rgb_67x45.png")
    r = oc.chat(model=MODEL, messages=[{"role": "user", "content": "Describe it.", "images": [raw]}],
                options={"temperature": 0, "num_predict": 5})
    assert r.eval_count == 5
    g = oc.generate(model=MODEL, prompt="Describe it.", images=[raw], options={"temperature": 0, "num_predict": 5})
    assert g.eval_count == 5
    # The same as an OpenAI request with the image before the text.
    a = chat(vl_server.openai(), data_url(raw), text="Describe it.", max_tokens=5)
    assert r.message.content == a.choices[0].message.content
    resp = vl_server.post("/api/chat", {"model": MODEL, "stream": False, "messages": [
        {"role": "user", "content": "x", "images": ["%%%"]}]})
    assert resp.status_code == 400 and "base64" in resp.json()["error"]
    resp = vl_server.post("/api/generate", {"model": MODEL, "stream": False, "prompt": "x",
                                            "images": [base64.b64encode(b"not an image").decode()]})
    assert resp.status_code == 400 and "bad image" in resp.json()["error"]


def test_the_default_model_names_the_missing_vision_weights(start_server):
    s = start_server(model=HOUSE)
    e = bad(s.openai(), data_url(image_bytes("rgb_67x45.png")))
    msg = e.response.json()["error"]["message"]
    assert "model.visual." in msg and "cannot take images" in msg, msg
    resp = s.post("/api/generate", {"model": MODEL, "stream": False, "prompt": "x",
                                    "images": [base64.b64encode(image_bytes("rgb_67x45.png")).decode()]})
    assert resp.status_code == 400 and "model.visual." in resp.json()["error"], resp.text
