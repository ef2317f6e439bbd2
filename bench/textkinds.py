"""Kinds of text for the filter benchmarks, built on any fresh machine, none used by a test.

A filter chain that is fast on wiki summaries can be slow on long technical documents
(punctuation, markup, code), on scripts without spaces and on very short texts; a figure
is only honest when it names the worst kind. Every kind here comes from what the project
can fetch from the package index, and no test reads it:

- `wiki pages`: the demo's crawl-like pages (navigation, cookie lines, 1-3 Wikipedia
  summaries) lengthened to about 2.7 KB;
- `technical docs`: windows of 2-60 KB over the reST/Markdown long descriptions of the
  installed third-party packages (Ray, pydantic, yarl, tqdm, ...);
- `code`: third-party Python modules from site-packages (never the standard library,
  which the demo and tests use), at most 60 KB;
- `non-English prose`: French and Spanish Wikipedia summaries in ~3.4 KB pages, and the
  translated messages of the Sphinx wheel in nine languages (Russian, Japanese, Chinese,
  Arabic, Hindi, Greek, Korean, German, Persian) joined into pages;
- `short texts and spam`: cookie banners, one-liners, keyword stuffing, repeated lines.
"""

from __future__ import annotations

import importlib.metadata
import random
import re
import sysconfig
import zipfile
from pathlib import Path

SPHINX_WHEEL = "sphinx==8.1.3"
PO_LANGS = ["ru", "ja", "zh_CN", "ar", "hi", "el", "ko", "de", "fa"]
KINDS = ["wiki pages", "technical docs", "code", "non-English prose", "short texts and spam"]


def _wheel_dir() -> Path:
    from bench.corpora import WHEEL_DIR

    return WHEEL_DIR


def wiki_pages(n: int, seed: int = 1) -> list[str]:
    from bench.corpora import crawl_pages as corpus

    return corpus(n, seed=seed)


def technical_docs(n: int, seed: int = 2) -> list[str]:
    bodies = []
    for d in importlib.metadata.distributions():
        name = (d.metadata["Name"] or "").lower()
        body = d.metadata.get_payload() or d.metadata.get("Description") or ""
        if name != "curate" and len(body) > 2000:
            bodies.append(body)
    bodies.sort()
    rng = random.Random(seed)
    out = []
    while len(out) < n and bodies:
        body = rng.choice(bodies)
        size = min(len(body), int(rng.triangular(2000, 60000, 5000)))
        start = rng.randrange(0, len(body) - size + 1)
        start = body.rfind("\n", 0, start) + 1  # a window starts at a line
        out.append(body[start:start + size])
    return out


def code(n: int, seed: int = 3) -> list[str]:
    root = Path(sysconfig.get_paths()["purelib"])
    files = []
    for p in sorted(root.glob("*/**/*.py")):
        if "curate" in p.parts[len(root.parts)].lower() or any(x in p.parts for x in ("tests", "test")):
            continue
        try:
            size = p.stat().st_size
        except OSError:
            continue
        if 2000 <= size <= 60000:
            files.append(p)
    rng = random.Random(seed)
    out = []
    for p in rng.sample(files, min(n, len(files))):
        try:
            out.append(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return out


def _po_messages(wheel: Path, lang: str) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        raw = z.read(f"sphinx/locale/{lang}/LC_MESSAGES/sphinx.po").decode("utf-8")
    out = []
    for block in raw.split("\n\n"):
        m = re.search(r'^msgstr ((?:".*"\n?)+)', block, re.M)
        if m:
            s = "".join(re.findall(r'"(.*)"', m.group(1))).replace("\\n", "\n").replace('\\"', '"')
            s = re.sub(r"%\(\w+\)[sdr]|%[sdr]|\{\w*\}", "X", s).strip()
            if len(s) > 20:
                out.append(s)
    return out


def non_english(n: int, seed: int = 4) -> list[str]:
    from pipeline import demo_data

    wheel_dir = _wheel_dir()
    wiki = demo_data.wiki_records(demo_data.wheel(wheel_dir))
    sphinx = demo_data.wheel(wheel_dir, SPHINX_WHEEL, "sphinx-8.1.3-*.whl", "the Sphinx wheel (translated messages)")
    rng = random.Random(seed)
    pools = [[r["text"] for r in wiki["fr"]], [r["text"] for r in wiki["es"]]]
    pools += [_po_messages(sphinx, lang) for lang in PO_LANGS]
    out = []
    for i in range(n):
        pool = pools[i % len(pools)]
        parts, size = [], 0
        target = rng.randint(1500, 6000)
        while size < target:
            # messages: a few to a line, paragraphs of a few lines (they are short UI strings)
            if i % len(pools) >= 2:
                s = " ".join(rng.choice(pool) for _ in range(rng.randint(1, 4)))
                s = s + ("" if s[-1:] in ".!?。！？।؟" else ".")
                sep = "\n\n" if rng.random() < 0.3 else "\n"
            else:
                s, sep = rng.choice(pool), "\n\n"
            parts.append(s + sep)
            size += len(s)
        out.append("".join(parts).strip())
    return out


COOKIE_TEXTS = [
    "We use cookies to give you the best experience on our website. By continuing you agree to our cookie policy.",
    "This site uses cookies. Accept | Reject | Settings",
    "Subscribe to our newsletter!\nEmail address\nSign up",
    "Sorry, this page is not available in your country.",
    "Please enable JavaScript to view this page.",
    "Terms of use. Privacy policy. Contact us. All rights reserved.",
]


def short_and_spam(n: int, seed: int = 5) -> list[str]:
    from pipeline import demo_data

    rng = random.Random(seed)
    words = demo_data.SPAM_WORDS
    out = []
    for i in range(n):
        k = i % 5
        if k == 0:
            out.append(rng.choice(COOKIE_TEXTS))
        elif k == 1:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(30, 200))))
        elif k == 2:
            line = f"{rng.choice(words).title()} {rng.choice(words)} {rng.choice(words)} now!!! ${rng.randint(5, 99)}.99"
            out.append("\n".join([line] * rng.randint(5, 40)))
        elif k == 3:
            out.append("\n".join(rng.choice(COOKIE_TEXTS + demo_data.SHORT) for _ in range(rng.randint(2, 8))))
        else:
            ws = [rng.choice(words) for _ in range(rng.randint(20, 80))]
            out.append(". ".join(" ".join(ws[j:j + 6]).capitalize() for j in range(0, len(ws), 6)) + ".")
    return out


def build(n: int) -> dict[str, list[str]]:
    """`n` documents of each kind (fewer for code if site-packages has fewer modules)."""
    return {"wiki pages": wiki_pages(n), "technical docs": technical_docs(n), "code": code(n),
            "non-English prose": non_english(n), "short texts and spam": short_and_spam(n)}


if __name__ == "__main__":
    for kind, docs in build(800).items():
        mb = sum(len(t.encode()) for t in docs) / 1e6
        print(f"{kind:<22} {len(docs):>5} docs {mb:6.1f} MB {1e3 * mb / max(1, len(docs)):6.1f} KB/doc")
