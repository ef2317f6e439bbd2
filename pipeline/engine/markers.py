"""A finished step's markers, read from its marker index when something asks, not held.

The driver used to keep every shard's marker of every step of a run: at 5x10^5 shards a
step and ~30 steps, tens of GB. A committed step's markers are now a `StepMarkers`, a
read-only mapping shard index -> marker over the step's `_markers-<fence>.json`: its length
comes from `_SUCCESS` (no read), and its contents are read on first use and kept in a small
cache, so the driver holds the markers of the steps it is planning from, not of the run.

Plans index markers shard by shard across a source's steps (ingest, filter, every layer);
while a step is planned the cache is `pinned()`: whatever the plan reads stays until it
returns, so no loop reads an index twice. Outside, the last `KEEP` (2) steps read stay.

Example:

    m = StepMarkers(step_dir / "_markers-abc.json", 3)
    len(m)            # 3, nothing read
    m[0]["rows"]      # reads the index once
    with pinned():
        plan(stats)   # every index the plan reads, read once
"""

from __future__ import annotations

import array
import operator
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import orjson

from pipeline.errors import RunError

WHOLE = 1024  # an index of at most this many markers is parsed whole (no spill file, no descriptor held)
KEEP = 2  # indexes kept outside pinned(): a loop over two steps' markers (ingest and filter) reads each once

_lock = threading.RLock()
_cache: OrderedDict[str, dict[int, dict]] = OrderedDict()
_pins = 0


class StepMarkers(Mapping):
    """The markers of a committed step (shard index -> marker), read when first used."""

    __slots__ = ("index", "count")

    def __init__(self, index: Path, count: int):
        self.index = index
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __contains__(self, i) -> bool:  # a committed step has every shard
        return isinstance(i, int) and 0 <= i < self.count

    def __getitem__(self, i: int) -> dict:
        return self._load()[i]

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.count))

    def values(self):
        return self._load().values()

    def items(self):
        return self._load().items()

    def __repr__(self) -> str:
        return f"StepMarkers({self.index}, {self.count} shards)"

    def _load(self) -> Mapping[int, dict]:
        key = str(self.index)
        with _lock:
            got = _cache.get(key)
            if got is not None:
                _cache.move_to_end(key)
                return got
        try:
            loaded = read_index(self.index, self.count)
        except (FileNotFoundError, ValueError) as e:
            raise RunError(f"{self.index}: the marker index of a finished step cannot be read ({type(e).__name__}); "
                           "delete its _SUCCESS so the step resumes from its shard markers, and run again") from None
        if len(loaded) != self.count:
            raise RunError(f"{self.index}: {len(loaded)} markers where _SUCCESS says {self.count}; delete the step's "
                           "_SUCCESS so it resumes from its shard markers, and run again")
        with _lock:
            _cache[key] = loaded
            _evict()
        return loaded


def _evict() -> None:
    while _pins == 0 and len(_cache) > KEEP:
        _cache.popitem(last=False)


@contextmanager
def pinned():
    """Keep every index read inside, until the outermost pinned() ends."""
    global _pins
    with _lock:
        _pins += 1
    try:
        yield
    finally:
        with _lock:
            _pins -= 1
            _evict()


def cached() -> int:
    """Indexes held now (for the driver bench and tests)."""
    return len(_cache)


def _spill_file(prefix: str):
    """A local spill file, gone when closed or collected: under CURATE_SPILL_DIR when set (a
    disk; the default temp folder may be a tmpfs, whose pages count as the driver's memory)."""
    return tempfile.TemporaryFile(prefix=prefix, dir=os.environ.get("CURATE_SPILL_DIR") or None)


class _Spill:
    """JSON records appended to a spill file, read back by their place: the driver keeps 12
    bytes a record (offset and length), not the record."""

    def __init__(self, prefix: str):
        self._f = _spill_file(prefix)

    def _put(self, data: bytes) -> tuple[int, int]:
        self._f.seek(0, 2)
        off = self._f.tell()
        self._f.write(data)
        return off, len(data)

    def _raw(self, off: int, n: int) -> bytes:
        self._f.seek(off)
        return self._f.read(n)

    def close(self) -> None:
        self._f.close()


class _Slots(_Spill, Mapping):
    """Markers by shard number in a spill file: the driver holds where each one is (12 bytes
    a shard), and a marker is parsed when asked for."""

    def __init__(self, n: int, prefix: str):
        super().__init__(prefix)
        self.n = n
        self._off = array.array("q", [-1]) * n
        self._len = array.array("i", [0]) * n
        self.count = 0

    def _at(self, i) -> int | None:
        """`i` as a shard number of this step that has a marker (numpy integers too), else None."""
        try:
            i = operator.index(i)
        except TypeError:
            return None
        return i if 0 <= i < self.n and self._off[i] >= 0 else None

    def _set(self, i: int, data: bytes) -> None:
        if self._off[i] < 0:
            self.count += 1
        self._off[i], self._len[i] = self._put(data)

    def __getitem__(self, i) -> dict:
        k = self._at(i)
        if k is None:
            raise KeyError(i)
        return orjson.loads(self._raw(self._off[k], self._len[k]))

    def __contains__(self, i) -> bool:
        return self._at(i) is not None

    def __iter__(self) -> Iterator[int]:
        return (i for i in range(self.n) if self._off[i] >= 0)

    def __len__(self) -> int:
        return self.count


class RunningMarkers(_Slots):
    """The markers of a step while it runs, as they arrive, in a local spill file: the driver
    holds where each one is (12 bytes a shard) and the rows so far, not the markers (a few
    hundred bytes to a few KB each). `commit` streams them into the marker index
    (`index_chunks`), in shard order; a lookup reads one back from the file.

    Example:

        m = RunningMarkers(3)
        m[2] = {"rows": 10}
        2 in m, len(m), m.rows   # True, 1, 10
    """

    def __init__(self, n: int):
        super().__init__(n, "curate-markers-")
        self.rows = 0

    def __setitem__(self, i: int, marker: dict) -> None:
        i = operator.index(i)
        if not 0 <= i < self.n:
            raise IndexError(f"shard {i} of a step of {self.n}")
        if i in self:  # replaced (a shard computed again): its rows counted once
            self.rows -= self[i].get("rows", 0)
        self._set(i, orjson.dumps(marker))
        self.rows += marker.get("rows", 0)

    def __repr__(self) -> str:
        return f"RunningMarkers({self.count} of {self.n} shards)"

    def index_chunks(self, batch: int = 4096) -> Iterator[bytes]:
        """The marker index (`{"0": {...}, "1": {...}}`, a marker a line, so that a reader can
        take it a line at a time: read_index), a few thousand markers at a time."""
        yield b"{\n"
        parts: list[bytes] = []
        for k, i in enumerate(self):
            parts.append(b'%s"%d":%s' % (b",\n" if k else b"", i, self._raw(self._off[i], self._len[i])))
            if len(parts) >= batch:
                yield b"".join(parts)
                parts = []
        yield b"".join(parts) + b"\n}\n"


class SpilledDicts(_Slots):
    """Dicts by shard number in a local spill file (the markers of the shards found in earlier
    folders, a step's `prior` hints): the driver holds 12 bytes a shard, not the dicts."""

    def __init__(self, n: int, prefix: str = "curate-found-"):
        super().__init__(n, prefix)

    def __setitem__(self, i: int, d: dict) -> None:
        self._set(operator.index(i), orjson.dumps(d))


class _Index(_Slots):
    """A committed step's markers copied from its index into a local spill file, a line at a
    time (read_index)."""

    def __init__(self, n: int):
        super().__init__(n, "curate-index-")

    def put(self, i: int, data: bytes) -> None:
        if not 0 <= i < self.n or self._off[i] >= 0:
            raise ValueError(f"shard {i} out of place in a marker index of {self.n}")
        self._set(i, data)


def read_index(path: Path, count: int) -> Mapping[int, dict]:
    """A marker index: a line at a time into a local spill (_Index) when it has more than
    WHOLE markers and was written a marker a line (index_chunks), else parsed whole (small
    steps, and indexes written by json.dump: older runs)."""
    with path.open("rb") as f:
        if count <= WHOLE:
            return {int(k): v for k, v in orjson.loads(f.read()).items()}
        head = f.read(3)
        if head[:2] != b"{\n" or head[2:] not in (b'"', b"}"):  # not a marker a line (indented, or one line)
            return {int(k): v for k, v in orjson.loads(head + f.read()).items()}
        out, closed, first = _Index(count), False, head[2:]
        for line in f:
            line, first = (first + line).rstrip(b"\r\n"), b""
            if line == b"}":
                closed = True
                continue
            if not line or closed:
                raise ValueError("not a marker index: text after its end")
            key, sep, body = line.removesuffix(b",").partition(b":")
            if not sep or not key.startswith(b'"'):
                raise ValueError("not a marker index: a line without its shard")
            out.put(int(key.strip(b'"')), body)
        if not closed:
            raise ValueError("a marker index cut short")
        return out


class SpilledSpecs(_Spill, Sequence):
    """A running step's shard specs, written to a local spill file as its plan yields them
    (the same pass writes step.json): the driver holds 12 bytes a shard, and a spec is read
    back when its task is submitted or a failure names its input."""

    def __init__(self):
        super().__init__("curate-specs-")
        self._off = array.array("q")
        self._len = array.array("i")

    def append_json(self, data: bytes) -> None:
        off, n = self._put(data)
        self._off.append(off)
        self._len.append(n)

    def __len__(self) -> int:
        return len(self._off)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        i = operator.index(i)
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return orjson.loads(self._raw(self._off[i], self._len[i]))
