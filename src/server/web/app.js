// The chat page: conversations in localStorage, replies streamed from /v1/chat/completions (SSE), rendered
// as Markdown, with the reasoning folded and tool calls shown. No dependencies.
(function () {
  "use strict";
  const M = window.DeltaflowMarkdown;
  const $ = function (id) { return document.getElementById(id); };
  const KEY_CHATS = "deltaflow.chats", KEY_CURRENT = "deltaflow.current", KEY_SETTINGS = "deltaflow.settings";
  const SETTINGS = ["system", "temperature", "top_p", "max_tokens", "thinking", "api_key"];

  let chats = load(KEY_CHATS, []);
  let current = load(KEY_CURRENT, null);
  let model = null;
  let running = null;  // {controller, message}

  function load(key, def) {
    try { const v = JSON.parse(localStorage.getItem(key)); return v === null ? def : v; } catch (e) { return def; }
  }
  function save() {
    localStorage.setItem(KEY_CHATS, JSON.stringify(chats));
    localStorage.setItem(KEY_CURRENT, JSON.stringify(current));
  }
  function chat() { return chats.find(function (c) { return c.id === current; }) || null; }
  function newChat() {
    const c = {id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: []};
    chats.unshift(c);
    current = c.id;
    save();
    return c;
  }

  // --- settings ---
  function loadSettings() {
    const s = load(KEY_SETTINGS, {});
    SETTINGS.forEach(function (k) { if (s[k] !== undefined) $(k).value = s[k]; });
  }
  function saveSettings() {
    const s = {};
    SETTINGS.forEach(function (k) { s[k] = $(k).value; });
    localStorage.setItem(KEY_SETTINGS, JSON.stringify(s));
  }
  function headers() {
    const h = {"Content-Type": "application/json"};
    const key = $("api_key").value.trim();
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  // --- rendering ---
  function renderList() {
    const ul = $("conversations");
    ul.innerHTML = "";
    chats.forEach(function (c) {
      const li = document.createElement("li");
      if (c.id === current) li.className = "current";
      const t = document.createElement("span");
      t.textContent = c.title;
      const del = document.createElement("button");
      del.textContent = "\u00d7";
      del.title = "Delete";
      del.onclick = function (ev) {
        ev.stopPropagation();
        chats = chats.filter(function (x) { return x.id !== c.id; });
        if (current === c.id) current = chats.length ? chats[0].id : null;
        save(); renderAll();
      };
      li.onclick = function () { if (!running) { current = c.id; save(); renderAll(); } };
      li.append(t, del);
      ul.append(li);
    });
  }

  function messageHtml(m) {
    let html = '<div class="role">' + (m.role === "user" ? "You" : M.escapeHtml(model || "assistant")) + "</div>";
    if (m.role === "user") return html + '<div class="content">' + M.escapeHtml(m.content).replace(/\n/g, "<br>") + "</div>";
    if (m.reasoning) {
      html += '<details class="reasoning"><summary>Reasoning (' + m.reasoning.length + " characters)</summary>" +
        '<div class="reasoning-text">' + M.render(m.reasoning) + "</div></details>";
    }
    html += '<div class="content">' + M.render(m.content || "") + "</div>";
    (m.tool_calls || []).forEach(function (tc) {
      let args = tc.arguments || "";
      try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* partial while streaming */ }
      html += '<div class="tool-call"><div>Tool call: <span class="name">' + M.escapeHtml(tc.name || "") +
        '</span></div><pre><code>' + M.escapeHtml(args) + "</code></pre></div>";
    });
    if (m.status) html += '<div class="status">' + M.escapeHtml(m.status) + "</div>";
    return html;
  }

  function renderMessage(m, el) {
    el.className = "msg " + m.role + (m.error ? " error" : "");
    // Keep a reasoning block open if the user opened it while the reply streams.
    const open = el.querySelector("details.reasoning[open]") !== null;
    el.innerHTML = m.error ? '<div class="role">Error</div>' + M.escapeHtml(m.error) : messageHtml(m);
    if (open && el.querySelector("details.reasoning")) el.querySelector("details.reasoning").open = true;
  }

  function renderAll() {
    renderList();
    const box = $("messages");
    box.innerHTML = "";
    const c = chat();
    if (!c) return;
    c.messages.forEach(function (m) {
      const el = document.createElement("div");
      renderMessage(m, el);
      box.append(el);
    });
    box.scrollTop = box.scrollHeight;
  }

  // --- sending ---
  function requestBody(c) {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({role: "system", content: system});
    c.messages.forEach(function (m) {
      if (m.error || (m.role === "assistant" && !m.content && !(m.tool_calls || []).length)) return;
      const out = {role: m.role, content: m.content || ""};
      if (m.tool_calls && m.tool_calls.length)
        out.tool_calls = m.tool_calls.map(function (t, i) {
          return {id: t.id || "call_" + i, type: "function", function: {name: t.name, arguments: t.arguments || "{}"}};
        });
      messages.push(out);
    });
    const body = {messages: messages, stream: true, stream_options: {include_usage: true}};
    if (model) body.model = model;
    const num = function (id) { const v = $(id).value.trim(); return v === "" ? null : Number(v); };
    if (num("temperature") !== null) body.temperature = num("temperature");
    if (num("top_p") !== null) body.top_p = num("top_p");
    if (num("max_tokens") !== null) body.max_tokens = num("max_tokens");
    const thinking = $("thinking").value;
    if (thinking) body.chat_template_kwargs = {enable_thinking: thinking === "on"};
    return body;
  }

  async function errorText(res) {
    const text = await res.text();
    try { const j = JSON.parse(text); if (j.error) return j.error.message || String(j.error); } catch (e) { /* not JSON */ }
    return "HTTP " + res.status + ": " + text.slice(0, 300);
  }

  async function send(text) {
    const c = chat() || newChat();
    c.messages.push({role: "user", content: text});
    if (c.title === "New chat") c.title = text.slice(0, 40);
    const m = {role: "assistant", content: "", reasoning: "", tool_calls: [], status: "generating..."};
    c.messages.push(m);
    save(); renderAll();
    const el = $("messages").lastElementChild;
    const controller = new AbortController();
    running = {controller: controller, message: m};
    $("send").hidden = true; $("stop").hidden = false;
    let pending = false;
    const paint = function () {
      if (pending) return;
      pending = true;
      requestAnimationFrame(function () {
        pending = false;
        const box = $("messages");
        const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
        renderMessage(m, el);
        if (atBottom) box.scrollTop = box.scrollHeight;
      });
    };
    try {
      const res = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), body: JSON.stringify(requestBody(c)), signal: controller.signal});
      if (!res.ok) throw new Error(await errorText(res));
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buf = "", finish = null, usage = null;
      for (;;) {
        const r = await reader.read();
        if (r.done) break;
        buf += decoder.decode(r.value, {stream: true});
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const event = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          event.split("\n").forEach(function (line) {
            if (!line.startsWith("data: ")) return;
            const data = line.slice(6);
            if (data === "[DONE]") return;
            const j = JSON.parse(data);
            if (j.error) throw new Error(j.error.message || "server error");
            if (j.usage) usage = j.usage;
            (j.choices || []).forEach(function (ch) {
              const d = ch.delta || {};
              if (d.content) m.content += d.content;
              if (d.reasoning_content) m.reasoning += d.reasoning_content;
              (d.tool_calls || []).forEach(function (tc) {
                const slot = m.tool_calls[tc.index] || (m.tool_calls[tc.index] = {id: tc.id, name: "", arguments: ""});
                if (tc.function && tc.function.name) slot.name = tc.function.name;
                if (tc.function && tc.function.arguments) slot.arguments += tc.function.arguments;
              });
              if (ch.finish_reason) finish = ch.finish_reason;
            });
          });
          paint();
        }
      }
      m.status = (finish ? "finished: " + finish : "") + (usage ? " \u00b7 " + usage.completion_tokens + " tokens" : "");
    } catch (e) {
      if (e.name === "AbortError") m.status = "stopped";
      else if (!m.content && !m.reasoning) { m.error = e.message; delete m.status; }
      else m.status = "error: " + e.message;
    } finally {
      running = null;
      $("send").hidden = false; $("stop").hidden = true;
      save();
      renderMessage(m, el);
    }
  }

  async function loadModel() {
    try {
      const res = await fetch("/v1/models", {headers: headers()});
      if (!res.ok) { $("model-name").textContent = "Deltaflow (" + (await errorText(res)) + ")"; return; }
      const j = await res.json();
      model = j.data && j.data.length ? j.data[0].id : null;
      $("model-name").textContent = model ? "Deltaflow \u00b7 " + model : "Deltaflow";
      if (!running) renderAll();  // the replies are labelled with the model's name
    } catch (e) {
      $("model-name").textContent = "Deltaflow (server unreachable)";
    }
  }

  // --- wiring ---
  $("composer").addEventListener("submit", function (ev) {
    ev.preventDefault();
    const text = $("input").value.trim();
    if (!text || running) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", function (ev) {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", function () { if (running) running.controller.abort(); });
  $("new-chat").addEventListener("click", function () { if (!running) { newChat(); renderAll(); $("input").focus(); } });
  $("settings-toggle").addEventListener("click", function () {
    const s = $("settings");
    s.hidden = !s.hidden;
    $("settings-toggle").setAttribute("aria-expanded", String(!s.hidden));
  });
  SETTINGS.forEach(function (k) { $(k).addEventListener("change", saveSettings); $(k).addEventListener("input", saveSettings); });
  $("api_key").addEventListener("change", loadModel);

  loadSettings();
  if (!chat()) current = chats.length ? chats[0].id : null;
  renderAll();
  loadModel();
  window.DeltaflowChat = {renderMessage: renderMessage, send: send};
})();
