// A small Markdown renderer and code highlighter for the chat page (no dependencies, works offline).
// Everything from the model is HTML-escaped first; only the tags made here reach the page. Handles what
// chat answers use: fenced code (highlighted; an unclosed fence while streaming is still code), inline code,
// headings, bold, italics, links (http/https only), lists, block quotes, rules and paragraphs.
(function () {
  "use strict";

  function escapeHtml(s) {
    return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  }

  const KEYWORDS = new Set((
    "and as assert async await break case catch class const continue def del do elif else enum except " +
    "export extends false False finally fn for from func function go if impl import in interface is lambda " +
    "let loop match mod mut new nil None nonlocal not null or package pass pub raise return self static " +
    "struct super switch this throw true True try type typeof use var void while with yield auto bool " +
    "char double float int long namespace template typename unsigned using virtual").split(" "));

  // One pass over the code with a combined pattern; each kind of token gets a class.
  function highlight(code, lang) {
    const hashComments = /^(py|python|sh|bash|shell|zsh|ruby|rb|yaml|yml|toml|r|perl)$/i.test(lang || "");
    const comment = hashComments ? "#[^\\n]*" : "\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?(?:\\*\\/|$)";
    const re = new RegExp(
      "(" + comment + ")" +
      "|(\"\"\"[\\s\\S]*?(?:\"\"\"|$)|'''[\\s\\S]*?(?:'''|$)|\"(?:\\\\.|[^\"\\\\\\n])*\"?|'(?:\\\\.|[^'\\\\\\n])*'?|`(?:\\\\.|[^`\\\\])*`?)" +
      "|\\b(\\d+(?:\\.\\d+)?(?:[eE][+-]?\\d+)?|0x[0-9a-fA-F]+)\\b" +
      "|([A-Za-z_][A-Za-z0-9_]*)(?=\\s*\\()" +
      "|([A-Za-z_][A-Za-z0-9_]*)", "g");
    let out = "", last = 0, m;
    while ((m = re.exec(code)) !== null) {
      if (m[0] === "") { re.lastIndex++; continue; }
      out += escapeHtml(code.slice(last, m.index));
      const t = escapeHtml(m[0]);
      if (m[1]) out += '<span class="hl-com">' + t + "</span>";
      else if (m[2]) out += '<span class="hl-str">' + t + "</span>";
      else if (m[3]) out += '<span class="hl-num">' + t + "</span>";
      else if (m[4]) out += KEYWORDS.has(m[4]) ? '<span class="hl-kw">' + t + "</span>" : '<span class="hl-fn">' + t + "</span>";
      else if (m[5] && KEYWORDS.has(m[5])) out += '<span class="hl-kw">' + t + "</span>";
      else out += t;
      last = re.lastIndex;
    }
    return out + escapeHtml(code.slice(last));
  }

  // Inline spans of one escaped-later line: code first (its content is literal), then the rest.
  function inline(text) {
    const parts = text.split(/(`[^`\n]+`)/);
    return parts.map(function (p, i) {
      if (i % 2 === 1) return "<code>" + escapeHtml(p.slice(1, -1)) + "</code>";
      let s = escapeHtml(p);
      s = s.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g,
        '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
      s = s.replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>");
      s = s.replace(/__([^_\n]+)__/g, "<strong>$1</strong>");
      s = s.replace(/(^|[^*\w])\*([^*\s][^*\n]*?)\*(?!\w)/g, "$1<em>$2</em>");
      return s;
    }).join("");
  }

  function render(text) {
    const lines = text.replace(/\r\n/g, "\n").split("\n");
    const html = [];
    let para = [];
    let list = null;  // {tag, items}
    function flushPara() {
      if (para.length) html.push("<p>" + para.map(inline).join("<br>") + "</p>");
      para = [];
    }
    function flushList() {
      if (list) html.push("<" + list.tag + ">" + list.items.map(function (x) { return "<li>" + inline(x) + "</li>"; }).join("") + "</" + list.tag + ">");
      list = null;
    }
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/);
      if (fence) {
        flushPara(); flushList();
        const body = [];
        let j = i + 1;
        while (j < lines.length && !lines[j].trim().startsWith(fence[1])) body.push(lines[j++]);
        const lang = fence[2] || "";
        html.push('<pre><code class="lang-' + escapeHtml(lang || "text") + '">' + highlight(body.join("\n"), lang) + "</code></pre>");
        i = j;  // the closing fence (or the end while it streams)
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      if (heading) {
        flushPara(); flushList();
        const n = heading[1].length;
        html.push("<h" + n + ">" + inline(heading[2]) + "</h" + n + ">");
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { flushPara(); flushList(); html.push("<hr>"); continue; }
      const quote = line.match(/^>\s?(.*)$/);
      if (quote) { flushPara(); flushList(); html.push("<blockquote>" + inline(quote[1]) + "</blockquote>"); continue; }
      const ul = line.match(/^\s*[-*+]\s+(.*)$/), ol = line.match(/^\s*\d+[.)]\s+(.*)$/);
      if (ul || ol) {
        flushPara();
        const tag = ul ? "ul" : "ol";
        if (list && list.tag !== tag) flushList();
        if (!list) list = {tag: tag, items: []};
        list.items.push((ul || ol)[1]);
        continue;
      }
      if (line.trim() === "") { flushPara(); flushList(); continue; }
      flushList();
      para.push(line);
    }
    flushPara(); flushList();
    return html.join("\n");
  }

  window.DeltaflowMarkdown = {render: render, highlight: highlight, escapeHtml: escapeHtml};
})();
