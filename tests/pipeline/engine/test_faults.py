"""Faults are routine (issue 35): a transient fault is retried inside the shard, a shard that
fails for good never cancels the others, the run fails once at the end listing every failed
shard, and the rerun computes only those (and what needs them).

Real runs of the small mixture with a `type: python` filter whose module the test writes:
it raises on one planted document until a file says the cause is fixed, or raises a reset
connection the first time each worker process calls it."""

from __future__ import annotations

import io
import os
import re
from collections import Counter

import orjson
import zstandard

from pipeline.io import atomic
from tests.conftest import curate, mixture_shas, small_mixture, write_yaml

RULES = '''
import os

HERE = os.path.dirname(os.path.abspath(__file__))
WORD = open(os.path.join(HERE, "word.txt")).read().strip()
_calls = {"n": 0}


def keep(text):
    if WORD in text and not os.path.exists(os.path.join(HERE, "fixed")):
        raise ValueError("boom: a bug this document triggers")
    return True


def flaky(text):
    _calls["n"] += 1
    if _calls["n"] == 1 and not os.path.exists(os.path.join(HERE, "calm")):  # each worker's first call
        raise ConnectionResetError(104, "Connection reset by peer")
    return True


def dies_once(text):
    mark = os.path.join(HERE, "died")
    if not os.path.exists(mark):  # the first call of the whole run: its worker process dies
        open(mark, "w").close()
        os._exit(3)
    return flaky(text)
'''


def _rare_word(corpus) -> str:
    """A long word in exactly one document of the small mixture's web files."""
    df: Counter = Counter()
    for f in sorted((corpus / "web").glob("crawl-0000[01].jsonl.zst")):
        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(f.read_bytes())).read()
        for line in data.splitlines():
            df.update(set(re.findall(r"[A-Za-z]{11,}", orjson.loads(line)["text"])))
    return min(w for w, n in df.items() if n == 1)


def _mixture(corpus, d, fn: str) -> str:
    text = small_mixture(str(corpus), str(d / "out")).replace("filters: [rep]", "filters: [rep, user]")
    text = text.replace("rep: {type: gopher_repetition}", f'rep: {{type: gopher_repetition}}\n          user: {{type: python, callable: "faultrules:{fn}"}}')
    return write_yaml(d / "m.yaml", text)


def test_a_shard_that_fails_for_good_fails_the_run_at_the_end_and_the_rerun_computes_only_it(demo_corpus, small_run,
                                                                                             tmp_path):
    (tmp_path / "faultrules.py").write_text(RULES)
    (tmp_path / "word.txt").write_text(_rare_word(demo_corpus))
    y = _mixture(demo_corpus, tmp_path, "keep")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    first = curate("run", str(y), "--workers", "2", env=env)
    assert first.returncode == 1, first.stderr[-3000:]
    err = first.stderr
    assert "Traceback" not in err
    failed = re.findall(r"step filter-web, shard (\d+) \((.*?)\) failed: ValueError: boom", err)
    assert len(failed) == 1 and "1 shard failed, every other shard finished" in err, err[-3000:]
    run_dir = tmp_path / "out" / "remote"
    rec = atomic.read_json(run_dir / "run.json")
    steps = rec["steps"]
    assert rec["status"] == "FAILED" and [f["shard"] for f in rec["failed_shards"]["filter-web"]] == [int(failed[0][0])]
    assert steps["filter-web"]["computed"] >= 1  # the others ran to the end
    assert steps["ingest-wiki"]["status"] == "SUCCESS"  # steps that do not need it finished too
    (tmp_path / "fixed").write_text("")
    again = curate("run", str(y), "--workers", "2", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    steps2 = atomic.read_json(run_dir / "run.json")["steps"]
    assert steps2["filter-web"]["computed"] == 1  # only the failed shard
    assert all(steps2[k]["computed"] == 0 for k in steps if steps[k]["status"] == "SUCCESS")
    assert atomic.read_json(run_dir / "ledger.json")["conservation"] is True
    assert mixture_shas(run_dir) == mixture_shas(small_run)  # as if nothing had failed


def test_a_transient_fault_is_retried_inside_the_shard_with_the_same_bytes(demo_corpus, small_run, tmp_path):
    (tmp_path / "faultrules.py").write_text(RULES)
    (tmp_path / "word.txt").write_text("unused")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    y = _mixture(demo_corpus, tmp_path, "flaky")
    r = curate("run", str(y), "--workers", "2", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = atomic.read_json(tmp_path / "out" / "remote" / "run.json")["steps"]
    assert steps["filter-web"]["computed"] == steps["filter-web"]["shards"] > 1
    # a filter that keeps every document : the bytes of the plain run
    assert mixture_shas(tmp_path / "out" / "remote") == mixture_shas(small_run)


class _Flaky:
    """A stream that gives `good` bytes, then an error (as a disk or a store connection does)."""

    def __init__(self, good: bytes, error: Exception):
        self.good, self.error = good, error

    def read1(self, n: int) -> bytes:
        if self.good:
            out, self.good = self.good[:n], self.good[n:]
            return out
        raise self.error


def test_a_passing_read_fault_is_raised_for_a_retry_and_a_damaged_stream_is_reported():
    import errno
    import zlib

    from pipeline.io.faults import transient
    from pipeline.io.readers import _stream_lines

    for e in (OSError(errno.EIO, "Input/output error"), ConnectionResetError(104, "Connection reset by peer"),
              OSError(errno.EREMOTEIO, "Internal Server Error"), TimeoutError("read timed out")):
        assert transient(e)
        it = _stream_lines(_Flaky(b'{"a": 1}\n{"a"', e))
        assert next(it) == b'{"a": 1}\n'
        try:
            next(it)
            raise AssertionError("a transient fault must be raised, so the shard runs again")
        except type(e):
            pass
    damaged = zlib.error("invalid stored block lengths")  # a cut or corrupt file: not transient
    assert not transient(damaged) and not transient(ValueError("boom")) and not transient(OSError(errno.ENOENT, "gone"))
    assert list(_stream_lines(_Flaky(b'{"a": 1}\n', damaged))) == [b'{"a": 1}\n', damaged]
