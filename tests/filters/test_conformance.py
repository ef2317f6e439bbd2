"""Our filters against datatrove's own, on the same real documents: decisions must agree.

The corpus is the demo's real text: 1,500 English Wikipedia summaries and 1,500 crawl-like
pages built around them (boilerplate, spam, copies); then long technical documents (the
standard library's modules, code and docstrings, up to 40 KB) and non-English pages
(French and Spanish summaries, three to eight to a page), where the word splitting and
the n-gram kernels are most stressed. Disagreements, if any, are written
with both reasons to `$CURATE_ARTIFACTS/conformance-<filter>.jsonl` (default: the test's
temporary directory) so they can be read.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gzip
import random

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from filters import base, models

# datatrove's reason -> ours, where we renamed it to say what failed
REASONS = {
    "gopher_short_doc": "too_few_words", "gopher_long_doc": "too_many_words",
    "gopher_below_avg_threshold": "avg_word_length_below_min", "gopher_above_avg_threshold": "avg_word_length_above_max",
    "gopher_too_many_hashes": "too_many_hashes", "gopher_too_many_ellipsis": "too_many_ellipses",
    "gopher_too_many_bullets": "too_many_bullet_lines", "gopher_too_many_end_ellipsis": "too_many_ellipsis_lines",
    "gopher_below_alpha_threshold": "too_few_alpha_words", "gopher_enough_stop_words": "too_few_stop_words",
    "< 3 paragraphs": "too_few_paragraphs",
}


@pytest.fixture(scope="module")
def corpus(demo_corpus) -> list[str]:
    wiki = pq.read_table(demo_corpus / "wiki" / "summaries_en.parquet", columns=["text"]).column("text").to_pylist()[:1500]
    raw = zstandard.ZstdDecompressor().stream_reader(open(demo_corpus / "web" / "crawl-00000.jsonl.zst", "rb")).read()
    web = [orjson.loads(x)["text"] for x in raw.splitlines()]
    raw = zstandard.ZstdDecompressor().stream_reader(open(demo_corpus / "web" / "crawl-00001.jsonl.zst", "rb")).read()
    web += [orjson.loads(x)["text"] for x in raw.splitlines()]
    return wiki + web[:1500]


@pytest.fixture(scope="module")
def long_technical(demo_corpus) -> list[str]:
    texts = []
    for f in sorted((demo_corpus / "code").glob("*.jsonl.gz")):
        texts += [orjson.loads(x)["text"] for x in gzip.decompress(f.read_bytes()).splitlines()]
    texts = sorted((t for t in texts if 4000 <= len(t) <= 40000), key=len)
    return texts[:: max(1, len(texts) // 250)][:250]


@pytest.fixture(scope="module")
def non_english(demo_corpus) -> list[str]:
    rng = random.Random(7)
    out = []
    for lang in ("fr", "es"):
        summ = pq.read_table(demo_corpus / "wiki" / f"summaries_{lang}.parquet", columns=["text"]).column("text").to_pylist()
        for _ in range(200):
            out.append("\n\n".join(rng.sample(summ, rng.randint(3, 8))))
    return out


def _datatrove(name: str):
    from datatrove.pipeline import filters as dt

    return {
        "gopher_quality": lambda: dt.GopherQualityFilter(),
        "gopher_repetition": lambda: dt.GopherRepetitionFilter(),
        "c4_quality": lambda: dt.C4QualityFilter(filter_no_terminal_punct=False),
        "c4_paragraph": lambda: dt.C4ParagraphFilter(),
        "fineweb_quality": lambda: dt.FineWebQualityFilter(),
    }[name]()


OURS = {"c4_quality": {"filter_no_terminal_punct": False}}


def _dt_chunk(name: str, lo: int, texts: list[str], rewrite: bool = False) -> list:
    """datatrove's filter `name` on texts[lo:...]: (keep, reason), or with `rewrite` the
    text it leaves (None when removed). Module level: it runs in the pool's processes."""
    from datatrove.data import Document

    dt_filter = _datatrove(name)
    out = []
    for i, text in enumerate(texts, lo):
        doc = Document(text=text, id=str(i))
        r = dt_filter.filter(doc)
        r = r if isinstance(r, tuple) else (bool(r), None)
        out.append((doc.text if r[0] else None) if rewrite else r)
    return out


@pytest.fixture(scope="module")
def pool():
    """Two processes for datatrove's side (the slow one): the comparison is the same, in half
    the wall time on the 2 cores CI has. Spawned, not forked: the test process may hold a Ray."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as ex:
        yield ex


def _datatrove_on(pool, name: str, corpus: list[str], rewrite: bool = False) -> list:
    step = max(1, -(-len(corpus) // 16))
    futures = [pool.submit(_dt_chunk, name, lo, corpus[lo:lo + step], rewrite) for lo in range(0, len(corpus), step)]
    return [r for f in futures for r in f.result()]


def _agreement(pool, name: str, corpus: list[str], out: Path):
    """(documents where decision and reason agree, documents our filter removes); every
    disagreement written to `out` with both reasons."""
    theirs = _datatrove_on(pool, name, corpus)
    ours = base.build(base.parse_params({"type": name, **OURS.get(name, {})}))
    res = ours.apply(pa.RecordBatch.from_pydict({"id": [str(i) for i in range(len(corpus))], "text": corpus}))
    agree = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        for i, ((keep, reason), k, ours_reason) in enumerate(zip(theirs, res.keep, res.reasons)):
            same = bool(keep) == bool(k) and (keep or REASONS.get(reason, reason) == ours_reason)
            agree += same
            if not same:
                f.write(orjson.dumps({"i": i, "datatrove": [keep, reason], "ours": [bool(k), ours_reason], "text": corpus[i][:500]}) + b"\n")
    return agree, int((~res.keep).sum())


FILTERS = ["gopher_quality", "gopher_repetition", "c4_quality", "c4_paragraph", "fineweb_quality"]


@pytest.mark.parametrize("name", FILTERS)
def test_decisions_agree_with_datatrove(name, corpus, pool, tmp_path):
    agree, removed = _agreement(pool, name, corpus, Path(os.environ.get("CURATE_ARTIFACTS") or tmp_path) / f"conformance-{name}.jsonl")
    rate = agree / len(corpus)
    print(f"{name}: {agree}/{len(corpus)} documents agree with datatrove ({rate:.2%}), decision and reason")
    assert len(corpus) >= 2000
    assert rate >= 0.995
    assert removed > 20 or name == "c4_paragraph"  # the corpus does exercise the filter


@pytest.mark.parametrize("kind", ["long_technical", "non_english"])
@pytest.mark.parametrize("name", FILTERS)
def test_decisions_agree_on_long_technical_and_non_english_text(name, kind, request, pool, tmp_path):
    texts = request.getfixturevalue(kind)
    out = Path(os.environ.get("CURATE_ARTIFACTS") or tmp_path) / f"conformance-{name}-{kind}.jsonl"
    agree, removed = _agreement(pool, name, texts, out)
    rate = agree / len(texts)
    print(f"{name} on {kind}: {agree}/{len(texts)} documents agree with datatrove ({rate:.2%}); we remove {removed}")
    assert len(texts) >= 200
    assert rate >= 0.995


@pytest.fixture(scope="module")
def lid_model() -> Path:
    p = models.lid176_path()
    if not p.is_file():
        pytest.fail(models.missing_model_message("tests", p))
    return p


def test_language_filter_agrees_with_datatrove_on_the_same_model(lid_model, demo_corpus, corpus):
    import datatrove.utils.lid as lid
    from datatrove.data import Document
    from datatrove.pipeline.filters import LanguageFilter

    fr = pq.read_table(demo_corpus / "wiki" / "summaries_fr.parquet", columns=["text"]).column("text").to_pylist()[:300]
    texts = corpus[:1700] + fr
    lid.FT176LID.MODEL_URL = str(lid_model)
    dt = LanguageFilter(languages=["en"], language_threshold=0.65)
    theirs = [bool(dt.filter(Document(text=t, id=str(i)))) for i, t in enumerate(texts)]
    res = base.build(base.parse_params({"type": "language", "languages": ["en"], "min_score": 0.65})).apply(
        pa.RecordBatch.from_pydict({"id": [str(i) for i in range(len(texts))], "text": texts}))
    agree = sum(a == b for a, b in zip(theirs, res.keep))
    print(f"language: {agree}/{len(texts)} agree with datatrove")
    assert agree / len(texts) >= 0.99
    assert res.scores["lang"].to_pylist()[-1] == "fr" and res.reasons[-1] == "wrong_language:fr"


def test_language_id_accuracy_on_wiki_en_fr_es(lid_model, demo_corpus):
    flt = base.build(base.parse_params({"type": "language", "label_only": True}))
    total = correct = 0
    for lang in ("en", "fr", "es"):
        texts = pq.read_table(demo_corpus / "wiki" / f"summaries_{lang}.parquet", columns=["text"]).column("text").to_pylist()[:1000]
        res = flt.apply(pa.RecordBatch.from_pydict({"id": ["x"] * len(texts), "text": texts}))
        got = res.scores["lang"].to_pylist()
        acc = sum(g == lang for g in got) / len(got)
        print(f"language id {lang}: {acc:.2%} of {len(got)}")
        assert acc >= 0.95
        assert res.keep.all()
        total += len(got)
        correct += sum(g == lang for g in got)
    assert correct / total >= 0.95


@pytest.mark.parametrize("min_score", [0.65, 0.3])
def test_top_label_shortcut_gives_the_decisions_and_scores_of_all_labels(lid_model, demo_corpus, min_score):
    """With min_score >= 0.5 the filter asks fastText for the top label only; below, for all.
    Either way: the same result as the rule applied to every label's probability."""
    from filters.language import load_model

    wiki = {lang: pq.read_table(demo_corpus / "wiki" / f"summaries_{lang}.parquet", columns=["text"]).column("text").to_pylist()
            for lang in ("en", "fr", "es")}
    texts = [t for lang in wiki for t in wiki[lang][:200]]
    texts += ["ok", "12345", "Hello bonjour hola ciao", ""]  # low-confidence texts
    # French pages with a growing share of English: English is often a close second, not the top
    texts += [wiki["fr"][i][:400] + " " + wiki["en"][i][: 40 * k] for i in range(40) for k in range(1, 9)]
    res = base.build(base.parse_params({"type": "language", "languages": ["en", "es"], "min_score": min_score})).apply(
        pa.RecordBatch.from_pydict({"id": ["x"] * len(texts), "text": texts}))
    labels, probs = load_model(str(lid_model)).predict([t.replace("\n", " ") for t in texts], k=-1)
    for i, (labs, ps) in enumerate(zip(labels, probs)):
        scores = {lab[9:]: float(p) for lab, p in zip(labs, ps)}
        best = max(scores, key=scores.get)
        ok = scores.get("en", 0.0) > min_score or scores.get("es", 0.0) > min_score
        assert (res.keep[i], res.scores["lang"][i].as_py(), res.scores["lang_score"][i].as_py()) == (ok, best, scores[best]), i
        assert res.reasons[i] == (None if ok else "low_language_score" if best in ("en", "es") else f"wrong_language:{best}")
    assert 0 < res.keep.sum() < len(texts)
    second = [i for i, (labs, ps) in enumerate(zip(labels, probs))
              if labs[0][9:] not in ("en", "es") and any(lab[9:] in ("en", "es") and p > min_score for lab, p in zip(labs, ps))]
    if min_score < 0.5:  # the case the shortcut would get wrong, present and kept
        assert second and all(res.keep[i] for i in second)


def test_language_filter_runs_with_no_network(lid_model, tmp_path):
    """In a network namespace with no interfaces up: no download is possible, and none is needed."""
    code = (
        "import socket, pyarrow as pa\n"
        "from filters import base\n"
        "try:\n    socket.create_connection(('pypi.org', 443), timeout=3); print('NETWORK')\n"
        "except OSError:\n    print('no network')\n"
        "f = base.build(base.parse_params({'type': 'language', 'languages': ['en']}))\n"
        "r = f.apply(pa.RecordBatch.from_pydict({'id': ['a', 'b'], 'text': ['The cat sat on the mat and looked at the dog.', 'El gato se sentó en la alfombra.']}))\n"
        "print(r.keep.tolist(), r.scores['lang'].to_pylist())\n"
    )
    r = subprocess.run(["unshare", "-n", sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["no network", "[True, False] ['en', 'es']"]


def test_missing_model_is_a_clear_error_not_a_download(tmp_path, monkeypatch):
    monkeypatch.setenv("CURATE_MODEL_DIR", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match=r"run `curate fetch-models`.*never downloaded at run time"):
        base.build(base.parse_params({"type": "language", "languages": ["en"]}))


def test_c4_rewrite_gives_datatrove_text(corpus, pool):
    theirs = _datatrove_on(pool, "c4_quality", corpus, rewrite=True)
    ours = base.build(base.parse_params({"type": "c4_quality", "filter_no_terminal_punct": False, "rewrite": True}))
    res = ours.apply(pa.RecordBatch.from_pydict({"id": [str(i) for i in range(len(corpus))], "text": corpus}))
    mine = [None if not k else (t if t is not None else orig) for k, t, orig in zip(res.keep, res.texts, corpus)]
    same = sum(a == b for a, b in zip(theirs, mine))
    print(f"c4 rewrite: {same}/{len(corpus)} identical texts (or both removed)")
    assert same / len(corpus) >= 0.99 and sum(t is not None for t in res.texts) > 100


def test_prefix_option_identifies_the_language_of_the_first_characters(lid_model, demo_corpus):
    wiki = {lang: pq.read_table(demo_corpus / "wiki" / f"summaries_{lang}.parquet", columns=["text"]).column("text").to_pylist()
            for lang in ("en", "fr")}
    # a French opening followed by much more English: the whole text reads English, its prefix French
    texts = [wiki["fr"][i][:300] + "\n" + "\n".join(wiki["en"][i * 8:(i + 1) * 8]) for i in range(50)]
    texts += wiki["en"][500:600]

    def run(params, docs):
        res = base.build(base.parse_params({"type": "language", "languages": ["en"], **params})).apply(
            pa.RecordBatch.from_pydict({"id": [str(i) for i in range(len(docs))], "text": docs}))
        return res.scores["lang"].to_pylist(), res.scores["lang_score"].to_pylist(), res.keep.tolist()

    whole = run({}, texts)
    prefix = run({"max_chars": 250}, texts)
    assert prefix == run({}, [t[:250] for t in texts])  # exactly the prefix, nothing else
    assert sum(x == "en" for x in whole[0][:50]) >= 45 and sum(x == "fr" for x in prefix[0][:50]) >= 45
    assert whole[0][50:] == ["en"] * 100 and prefix[0][50:] == ["en"] * 100
