"""Self-contained HTML pages: the sample browser and the report's frame.

Document text is untrusted web content. The records go into the page as JSON inside a
`<script type="application/json">` block with `<`, `>` and `&` written as \\u escapes,
so nothing in a document can close the block; the page's script builds every element
with `textContent`, never `innerHTML`, so a document's `<script>` or `onerror=` is shown
as text. A Content-Security-Policy allows only the page's own inline script and style
and no network at all (`default-src 'none'`): the page works from `file://` and makes no
request.
"""

from __future__ import annotations

import html

import orjson

CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


def json_for_script(obj) -> str:
    s = orjson.dumps(obj).decode()
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def page(title: str, body: str, style: str = "", script: str = "") -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin: .5em 0 1.5em; }}
td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: right; }}
th {{ background: #f3f3f3; }} td:first-child, th:first-child {{ text-align: left; }}
.doc {{ border: 1px solid #ccc; border-radius: 4px; margin: .8em 0; padding: .5em .8em; }}
.meta {{ color: #555; font-size: 12px; }} .reason {{ color: #a40; font-weight: 600; }}
pre {{ white-space: pre-wrap; word-wrap: break-word; background: #fafafa; padding: .5em; margin: .3em 0; max-height: 30em; overflow: auto; }}
.pair {{ display: grid; grid-template-columns: 1fr 1fr; gap: .8em; }}
mark {{ background: #ffe08a; }} .controls > * {{ margin-right: .6em; }}
{style}
</style></head><body>
{body}
<script>{script}</script>
</body></html>
"""


VIEWER_JS = r"""
"use strict";
const records = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls; return e; }
function options(sel, values) { for (const v of values) { const o = el("option", v); o.value = v; sel.appendChild(o); } }
function group(r) { const x = r.reason || ""; if (/^(exact|near)_duplicate_of:/.test(x)) return x.split(":")[0]; return x.split(" (")[0]; }
options($("source"), [...new Set(records.map(r => r.source))].sort());
options($("stage"), [...new Set(records.map(r => r.stage || "kept"))].sort());
options($("reason"), [...new Set(records.map(r => group(r)).filter(x => x))].sort());
function words(t) { return t.split(/(\s+)/); }
function diffMarks(a, b) {
  // word-level LCS between the common prefix and suffix; returns for each side a boolean per
  // token: true = not in the other text. A middle too large for the LCS is marked whole.
  const A = words(a), B = words(b), ma = new Array(A.length).fill(false), mb = new Array(B.length).fill(false);
  let p = 0, s = 0;
  while (p < A.length && p < B.length && A[p] === B[p]) p++;
  while (s < A.length - p && s < B.length - p && A[A.length - 1 - s] === B[B.length - 1 - s]) s++;
  const n = A.length - p - s, m = B.length - p - s;
  if (n * m > 4e6) { ma.fill(true, p, A.length - s); mb.fill(true, p, B.length - s); return [[A, ma], [B, mb]]; }
  const L = Array.from({length: n + 1}, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = A[p + i] === B[p + j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  ma.fill(true, p, A.length - s); mb.fill(true, p, B.length - s);
  let i = 0, j = 0;
  while (i < n && j < m) { if (A[p + i] === B[p + j]) { ma[p + i] = mb[p + j] = false; i++; j++; } else if (L[i + 1][j] >= L[i][j + 1]) i++; else j++; }
  return [[A, ma], [B, mb]];
}
function textBlock(tokens, marks) {
  const pre = el("pre");
  if (!marks) { pre.textContent = tokens; return pre; }
  const [toks, m] = marks;
  toks.forEach((t, k) => { if (m[k] && /\S/.test(t)) pre.appendChild(el("mark", t)); else pre.appendChild(document.createTextNode(t)); });
  return pre;
}
function card(r) {
  const d = el("div", undefined, "doc");
  d.dataset.source = r.source; d.dataset.stage = r.stage || "kept"; d.dataset.reason = group(r);
  const head = el("div", undefined, "meta");
  head.appendChild(el("b", r.source + " / " + (r.id || "")));
  head.appendChild(document.createTextNode("  " + (r.source_id || "") + "  " + (r.n_tokens ?? "?") + " tokens  "));
  if (r.status !== "kept") { head.appendChild(el("span", (r.stage || "") + ": ", "")); head.appendChild(el("span", r.reason || "", "reason")); }
  else head.appendChild(el("span", "kept"));
  const scores = Object.entries(r.scores || {}).map(([k, v]) => k + "=" + (typeof v === "number" ? +v.toFixed(4) : v));
  if (r.threshold !== undefined) scores.push("threshold=" + r.threshold);
  if (scores.length) head.appendChild(el("div", scores.join("  ")));
  if (r.original !== undefined) { d.dataset.rewritten = "1"; head.appendChild(el("div", "text rewritten by " + (r.rewritten_by || []).join(", "), "meta rewritten")); }
  if (r.url) head.appendChild(el("div", r.url, "url"));  // text, never a live link: crawled URLs are untrusted
  d.appendChild(head);
  if (r.survivor) {
    const marks = diffMarks(r.text || "", r.survivor.text || "");
    const pair = el("div", undefined, "pair");
    const left = el("div"); left.appendChild(el("div", "removed: " + r.id, "meta")); left.appendChild(textBlock(r.text || "", marks[0]));
    const right = el("div"); right.appendChild(el("div", "survivor: " + r.survivor.source + " / " + r.survivor.id, "meta")); right.appendChild(textBlock(r.survivor.text || "", marks[1]));
    pair.appendChild(left); pair.appendChild(right); d.appendChild(pair);
  } else if (r.eval_item) {  // contaminated: the document beside the eval item, the words they share marked
    const marks = diffMarks(r.text || "", r.eval_item.text || "");
    const shared = marks.map(([t, m]) => [t, m.map(x => !x)]);
    const pair = el("div", undefined, "pair");
    const left = el("div"); left.appendChild(el("div", "removed: " + r.id, "meta")); left.appendChild(textBlock(r.text || "", shared[0]));
    const right = el("div"); right.appendChild(el("div", "eval item: " + r.eval_item.set + " / " + r.eval_item.id, "meta")); right.appendChild(textBlock(r.eval_item.text || "", shared[1]));
    pair.appendChild(left); pair.appendChild(right); d.appendChild(pair);
  } else if (r.original !== undefined) {  // rewritten: the text as ingested beside the text now, the changes marked
    const marks = diffMarks(r.original, r.text || "");
    const pair = el("div", undefined, "pair");
    const left = el("div"); left.appendChild(el("div", "as ingested", "meta")); left.appendChild(textBlock(r.original, marks[0]));
    const right = el("div"); right.appendChild(el("div", "now", "meta")); right.appendChild(textBlock(r.text || "", marks[1]));
    pair.appendChild(left); pair.appendChild(right); d.appendChild(pair);
  } else {
    d.appendChild(textBlock(r.text || (r.error ? "error: " + r.error : "")));
  }
  return d;
}
const list = $("list");
const cards = records.map(r => { const c = card(r); list.appendChild(c); return [c, r]; });
// a rewritten text opens where it first changed, on both sides
for (const pre of document.querySelectorAll(".doc[data-rewritten] pre")) {
  const m = pre.querySelector("mark");
  if (m) pre.scrollTop = Math.max(0, m.offsetTop - pre.offsetTop - 40);
}
function apply() {
  const s = $("source").value, st = $("stage").value, re = $("reason").value, q = $("q").value.toLowerCase();
  let shown = 0;
  for (const [c, r] of cards) {
    const ok = (!s || r.source === s) && (!st || (r.stage || "kept") === st) && (!re || group(r) === re) && (!$("rw").checked || r.original !== undefined) && (!q || ((r.text || "") + " " + (r.url || "")).toLowerCase().includes(q));
    c.style.display = ok ? "" : "none"; if (ok) shown++;
  }
  $("count").textContent = shown + " of " + records.length + " documents";
}
for (const id of ["source", "stage", "reason", "rw"]) $(id).addEventListener("change", apply);
$("q").addEventListener("input", apply);
apply();
"""


def viewer(title: str, records: list[dict], note: str = "") -> str:
    body = f"""<h1>{html.escape(title)}</h1>
<p class="meta">{html.escape(note)}</p>
<div class="controls">
<select id="source"><option value="">all sources</option></select>
<select id="stage"><option value="">all stages</option></select>
<select id="reason"><option value="">all reasons</option></select>
<label><input id="rw" type="checkbox"> rewritten only</label>
<input id="q" type="search" placeholder="search text"> <span id="count"></span>
</div>
<div id="list"></div>
<script type="application/json" id="data">{json_for_script(records)}</script>"""
    return page(title, body, script=VIEWER_JS)
