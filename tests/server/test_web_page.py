"""The chat page at GET /, in a real headless Chromium (Debian's `chromium`, driven over the DevTools pipe):
it loads from the binary alone (every request same-origin: no CDN), sends a message, renders the streamed
reply (equal to the API's own answer), keeps the conversation across a reload, the stop button cancels the
engine's work, and the Markdown / reasoning / tool-call rendering. A screenshot goes to build/."""
import json
import os

import pytest

from cdp import Browser, chromium_path
from conftest import API_KEY, MODEL, deltaflow_bin



def shot_dir():
    """The build directory the binary lives in (the one with CMakeCache.txt), else the repository's build/."""
    d = os.path.dirname(os.path.abspath(deltaflow_bin()))
    while d != os.path.dirname(d):
        if os.path.exists(os.path.join(d, "CMakeCache.txt")):
            return d
        d = os.path.dirname(d)
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build")
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if not path:
        pytest.fail("chromium is not installed (scripts/install-deps.sh installs Debian's chromium)")
    b = Browser(path)
    yield b
    b.close()


def settings(b, **values):
    b.eval("""(() => {
      const v = %s;
      for (const k in v) { const el = document.getElementById(k); el.value = v[k];
                           el.dispatchEvent(new Event('change')); }
    })()""" % json.dumps(values))


def send(b, text):
    b.eval("document.getElementById('input').value = %s; document.getElementById('composer').requestSubmit();"
           % json.dumps(text))


def stored(b):
    return b.eval("JSON.parse(localStorage.getItem('deltaflow.chats'))")


def test_page_loads_offline_and_chats(browser, server, client):
    b = browser
    b.navigate(server.url + "/")
    assert b.eval("document.title") == "Deltaflow chat"
    # Every request the page made went to this server (nothing from a CDN).
    urls = [e["params"]["request"]["url"] for e in b.events if e.get("method") == "Network.requestWillBeSent"]
    assert urls and all(u.startswith(server.url) for u in urls), urls
    settings(b, api_key=API_KEY, temperature="0", max_tokens="24", thinking="off")
    b.eval("window.location.reload()")
    b.wait_event("Page.loadEventFired")
    b.wait_for("document.getElementById('model-name').textContent.includes(%s)" % json.dumps(MODEL))
    # Record every change of the reply while it streams.
    b.eval("""window.__seen = [];
      new MutationObserver(() => { const m = document.querySelector('.msg.assistant .content');
        if (m) window.__seen.push(m.textContent.length); })
        .observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});""")
    send(b, "Write a sort function")
    b.wait_for("(document.querySelector('.msg.assistant .status') || {}).textContent?.startsWith('finished')")
    chats = stored(b)
    assert len(chats) == 1 and chats[0]["title"] == "Write a sort function"
    user, reply = chats[0]["messages"]
    assert user == {"role": "user", "content": "Write a sort function"}
    # The same request through the API gives the same text (greedy).
    ref = client.chat.completions.create(model=MODEL, messages=[user], temperature=0, max_tokens=24,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply["content"] == ref.choices[0].message.content
    assert reply["status"].startswith("finished: " + ref.choices[0].finish_reason)
    rendered = b.eval("document.querySelector('.msg.assistant .content').textContent")
    assert rendered.strip() != "" or reply["content"].strip() == ""
    assert b.eval("window.__seen.length") >= 1
    b.screenshot(os.path.join(shot_dir(), "web-chat.png"))
    # Kept in the browser: after a reload the conversation is listed and shown.
    b.eval("window.location.reload()")
    b.wait_event("Page.loadEventFired")
    assert b.eval("document.querySelectorAll('#conversations li').length") == 1
    assert b.eval("document.querySelector('.msg.user .content').textContent") == "Write a sort function"


# The page's stream, seen slowly: each chunk 100 ms after the last, and the request made with ignore_eos so the
# tiny model cannot end it early. However fast the engine is, the page is still generating when Stop is clicked;
# an abort ends the slowed stream at once, as it ends a real one.
SLOW_STREAM = """(() => {
  const orig = window.fetch;
  window.fetch = async (url, opts) => {
    if (!String(url).includes('/chat/completions')) return orig(url, opts);
    const body = JSON.parse(opts.body); body.ignore_eos = true;
    const res = await orig(url, Object.assign({}, opts, {body: JSON.stringify(body)}));
    if (!res.ok || !res.body) return res;
    const reader = res.body.getReader(), signal = opts.signal;
    const aborted = () => new DOMException('The user aborted a request.', 'AbortError');
    const slow = new ReadableStream({
      async pull(c) {
        await new Promise(r => setTimeout(r, 100));
        if (signal && signal.aborted) { reader.cancel(); throw aborted(); }
        const {done, value} = await reader.read();
        if (done) c.close(); else c.enqueue(value);
      },
      cancel(reason) { return reader.cancel(reason); }});
    return new Response(slow, {status: res.status, statusText: res.statusText, headers: res.headers});
  };
})()"""


def test_stop_button_cancels_the_generation(browser, server):
    b = browser
    b.navigate(server.url + "/")
    settings(b, api_key=API_KEY, temperature="1", max_tokens="3000", thinking="off")
    b.eval(SLOW_STREAM)
    b.eval("document.getElementById('new-chat').click()")
    send(b, "Tell me a long story")
    b.wait_for("(document.querySelector('.msg.assistant .content') || {}).textContent?.length > 0")
    assert b.eval("document.getElementById('stop').hidden") is False
    b.eval("document.getElementById('stop').click()")
    b.wait_for("document.querySelector('.msg.assistant .status').textContent === 'stopped'")
    assert server.wait_idle(10), "the engine kept generating after Stop"
    assert b.eval("document.getElementById('send').hidden") is False


def test_markdown_reasoning_and_tool_calls_render(browser, server):
    b = browser
    b.navigate(server.url + "/")
    # Once the model's name is in, the page redraws the conversation; render after that.
    b.wait_for("document.getElementById('model-name').textContent.includes(%s)" % json.dumps(MODEL))
    html = b.eval("""(() => { const el = document.createElement('div');
      window.DeltaflowChat.renderMessage({role: 'assistant', reasoning: 'Think **first**.',
        content: '# Title\\n\\nSome **bold**, `x<y` and a [link](https://example.com).\\n\\n- one\\n- two\\n\\n' +
                 '```python\\ndef f(x):\\n    return "s"  # done\\n```\\n<script>alert(1)</script>',
        tool_calls: [{name: 'get_weather', arguments: '{"city": "Paris"}'}]}, el);
      document.getElementById('messages').append(el); return el.innerHTML; })()""")
    assert b.eval("document.querySelector('.msg.assistant h1').textContent") == "Title"
    assert "<strong>bold</strong>" in html and "<code>x&lt;y</code>" in html
    assert 'href="https://example.com"' in html and "<li>two</li>" in html
    assert '<span class="hl-kw">def</span>' in html and '<span class="hl-str">"s"</span>' in html
    assert '<span class="hl-com"># done</span>' in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    # Reasoning is folded (a closed <details>); the tool call shows its name and arguments.
    assert b.eval("document.querySelector('details.reasoning').open") is False
    assert b.eval("document.querySelector('details.reasoning summary').textContent").startswith("Reasoning")
    assert b.eval("document.querySelector('.tool-call .name').textContent") == "get_weather"
    assert '"city": "Paris"' in b.eval("document.querySelector('.tool-call pre').textContent")
    b.screenshot(os.path.join(shot_dir(), "web-chat-markdown.png"))


def test_page_needs_no_key_but_the_api_does(server):
    import httpx
    r = httpx.get(server.url + "/", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    for f in ("app.js", "markdown.js", "style.css"):
        assert httpx.get(server.url + "/web/" + f, timeout=10).status_code == 200
    assert httpx.get(server.url + "/web/nothing.js", timeout=10).status_code == 404
    assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 401
