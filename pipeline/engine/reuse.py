"""Reuse by content, shard by shard: a shard's output is keyed by what it reads.

A step's folder is named by its hash (config, code and its inputs' hashes: engine/step.py),
so an edit upstream gives every step below it a new folder. Inside the new folder each
shard is keyed by its content instead: the step's kind, config and code hashes, its shard
number, and its spec with every path into the step store replaced by the digest of the
bytes there (each shard task's marker lists the files it committed with their digests:
engine/task.py, io/fs.recording). Before a step's shards are queued, the keys of its
shards are looked up among the markers of the step's earlier folders (the same step name,
another hash: the variant before an edit, or before a new input file); a shard found there
is not computed but linked: its files are hard-linked into the new folder (on an object
store, references to the earlier objects in its marker: nothing copied, no document byte
through the driver) and its marker copied with the old folder's paths rewritten.

Early cutoff comes with it: a shard recomputed to the same bytes has the same digests, so
the shards that read it keep their keys and are linked, not computed, as in build systems
with early cutoff (Shake; Bazel's action cache keyed by input digests). A filter edit on
one source re-runs that source's filter shards; the dedup maps of the other sources, the
classifier trained on them, their scores and token files are linked; reducers whose input
changed run again over the maps' small outputs.

What is conservative (never wrong, sometimes not reused):
- a path into a step whose markers list no files (a step committed before this, or the
  step's own folder) keys by the path itself, which names the step's hash;
- the shard number is in the key (a task may write it into its bytes), so a new input file
  that sorts before others renumbers, and recomputes, the shards after it;
- a shard that committed a file outside its step folder is never reused.

Example:

    keys = Keys(store, steps, stats)
    k = keys.key(step, 3, spec)                  # sha256 hex, 32 chars
    found = candidates(store, step, {k: 3})      # shard -> (folder, its shard there, marker)
    if 3 in found: marker = link_shard(*found[3], step.dir(store), 3)
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

import orjson

from pipeline.engine.cutoff import json_str, renamed, hint
from pipeline.engine.markers import SpilledDicts, read_index
from pipeline.engine.step import MARKERS, Step, hash_json, iter_markers, shard_name, success
from pipeline.errors import RunError
from pipeline.io import atomic, fs

KEY_CHARS = 32  # of the sha256: 128 bits, no two shard contents share one in any store
VARIANTS = 8  # earlier folders of a step searched for reusable shards (the most recently finished)
# spec keys that never change a task's bytes: earlier results it may look values up in (`prior`), how it
# lays out its own intermediate work (`layout`: the engine settings a coordinator's rounds use)
HINTS = ("prior", "layout")
# a document shard's counts after its layers (plan/context.doc_shards), from their markers: a task
# that read-keys its `layers` leaves them out of its partial key with them (its read key covers them)
LAYER_COUNTS = ("kept", "tokens", "bucket_docs", "bucket_tokens", "groups")


class Keys:
    """Content keys of shards: a spec's store paths replaced by the digests of their bytes."""

    def __init__(self, store: Path, steps: Iterable[Step], stats: dict):
        self.root = str(fs.path(store) / "steps").rstrip("/") + "/"
        self.store = fs.path(store)
        self.by_folder = {s.dir(self.store).name: s for s in steps}
        self.stats = stats
        self._files: dict[str, dict[str, str] | None] = {}
        self._folders: dict[tuple[str, str], str] = {}
        self._dir_index: dict[str, dict[str, list]] = {}
        self._inner = re.compile(re.escape(self.root) + r"[^'\"\s,\]\}\)]+")

    def begin(self, step: Step) -> None:
        """Before `step`'s shards are keyed: let go of the file tables of folders it does not
        read (the driver holds the digests of one step's inputs, not of the run's steps)."""
        keep = {i.dir(self.store).name for i in step.inputs}
        for folder in [f for f in self._files if f not in keep]:
            del self._files[folder]
        self._folders = {k: v for k, v in self._folders.items() if k[0] in keep}
        self._dir_index = {k: v for k, v in self._dir_index.items() if k in keep}

    def key(self, step: Step, index: int, spec: dict) -> str:
        return self.both(step, index, spec)[0]

    def both(self, step: Step, index: int, spec: dict) -> tuple[str, str | None]:
        """(content key, partial key) of a shard, its spec digested once. The partial key
        leaves out the inputs its task digests itself (`step.read_keyed`; None for a step
        without them): an earlier shard of the same partial key is what the task compares
        what it reads with (engine/cutoff.same_as_before)."""
        body = self._digested({k: v for k, v in spec.items() if k not in HINTS}, step.dir(self.store).name)
        key = self._hash(step, index, body)
        if not step.read_keyed:
            return key, None
        drop = set(step.read_keyed)  # digesting keeps the spec's shape: dropping after it is dropping before
        # a document shard's counts come from its layers' markers: read through the read key. Only a
        # document shard's own (a dict with `documents`): a spec's other keys of those names (mix-route's
        # `tokens`, the path of a shard's token ids) are inputs of their own and stay in the key
        counts = set(LAYER_COUNTS) if "layers" in drop else set()
        part = {k: v for k, v in body.items() if k not in drop and not (k in counts and "documents" in body)}
        if isinstance(part.get("doc"), dict):
            part["doc"] = {k: v for k, v in part["doc"].items() if k not in drop | counts}
        return key, "p" + self._hash(step, index, part)[1:]

    @staticmethod
    def _hash(step: Step, index: int, body: dict) -> str:
        if step.position_free:  # the shard number and the document shard's global place left out
            index = None
            body = _placeless(body)
        return hash_json({"config": step.shard_config_hash, "code": step.code_hash, "shard": index,
                          "spec": body})[:KEY_CHARS]

    def _digested(self, v, own: str):
        if isinstance(v, str):
            if v.startswith(self.root):
                return self._path(v, own)
            if self.root in v:  # paths inside a string (a spec that carries a document shard's repr)
                return self._inner.sub(lambda m: self._path(m.group(0), own), v)
            return v
        if isinstance(v, dict):
            return {k: self._digested(x, own) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [self._digested(x, own) for x in v]
        return v

    def _path(self, v: str, own: str) -> str:
        folder, _, rel = v[len(self.root):].partition("/")
        rel = rel.rstrip("/")
        table = self._table(folder) if folder != own else None
        if table is None:
            return v  # names the step's hash: reused only where that step is the same
        got = table.get(rel)
        if got is not None:
            return "digest:" + got
        memo = (folder, rel)
        if memo not in self._folders:  # a folder: the digests of every file under it
            under = self._dirs(folder, table).get(rel)
            # a path that is no file and holds none (a stem a task adds an extension to, a file a
            # shard did not write) keys by itself, which names the step's hash: never by an empty
            # folder's constant digest
            self._folders[memo] = "folder:" + hash_json(sorted(under)) if under or not rel else v
        return self._folders[memo]

    def _dirs(self, folder: str, table: dict[str, str]) -> dict[str, list]:
        """Every folder of a step's files -> the (file, digest) pairs under it ("" : all), built
        once a step in one pass: a lookup a path, not a scan of the step's files (a scan was
        quadratic in the shards where each spec names a path that is no file)."""
        got = self._dir_index.get(folder)
        if got is None:
            got = {"": list(table.items())}
            for k, d in table.items():
                parts = k.split("/")
                for i in range(1, len(parts)):
                    got.setdefault("/".join(parts[:i]), []).append((k, d))
            self._dir_index[folder] = got
        return got

    def _table(self, folder: str) -> dict[str, str] | None:
        """relative path -> digest of every file a step's shards wrote, built once per step
        being keyed (`begin` lets go of it): a plan reads its inputs' for every shard."""
        if folder not in self._files:
            step = self.by_folder.get(folder)
            markers = self.stats.get(step.name) if step is not None else None
            table: dict[str, str] | None = {} if markers is not None else None
            for m in (markers.values() if markers is not None else ()):
                files = m.get("out_files")
                if files is None:  # computed before markers listed their files
                    table = None
                    break
                table.update(files)
            self._files[folder] = table
        return self._files[folder]


PLACES = ("k", "slot")  # a document shard's place in the run's global order and its decision slot


def _placeless(spec):
    """A spec without the places of the document shard it carries (a dict with `documents`,
    at its top or under `doc`: `k` and `slot`). A task that reads decisions by slot has the
    slot at its spec's top level (dedup's apply and fetch steps), where it stays in the key."""
    if isinstance(spec, dict):
        if "documents" in spec:
            return {k: v for k, v in spec.items() if k not in PLACES}
        if isinstance(spec.get("doc"), dict):
            return {**spec, "doc": _placeless(spec["doc"])}
        if isinstance(spec.get("doc"), str):  # a document shard carried as its repr
            return {**spec, "doc": re.sub(r"'(?:k|slot)': \d+, ", "", spec["doc"])}
    return spec


class Found(dict):
    """shard -> (folder, its shard there) of the wanted keys found in earlier folders, their
    markers in a spill file (`marker(j)`: the driver holds no marker a shard); `cost`: shard
    -> the CPU seconds of the shards not found, in the most recent earlier folder (what
    computing them again is likely to cost)."""

    cost: dict[int, float]
    mean: float | None  # a shard's CPU seconds in the most recent earlier folder, on average (None: no folder)
    markers: SpilledDicts

    hints: SpilledDicts  # shard -> the `prior` of a shard to compute (by its partial key)

    def marker(self, j: int) -> dict:
        with self.lock:  # one spill file read from the linking threads
            return self.markers[j]


def earlier(store: Path, step: Step, finished: bool = False) -> list[Path]:
    """`step`'s earlier folders in the store (the same step name, another hash), the most
    recently finished first; with `finished`, only those whose _SUCCESS is written. One
    listing of the steps folder and one _SUCCESS read per folder of the step's name."""
    store = fs.path(store)
    own = step.dir(store)
    root = store / "steps"
    prefix = step.name + "-"
    try:
        if fs.is_local(root):
            with os.scandir(root) as it:
                names = [e.name for e in it if e.is_dir()]
        else:
            fs.refresh(root)
            names = [p.name for p in root.iterdir()]
    except FileNotFoundError:
        names = []
    folders = [root / n for n in names if n.startswith(prefix) and n != own.name and _is_hash(n[len(prefix):])]
    dated = []
    for d in folders:
        rec = success(d)
        if rec is None and finished:
            continue
        dated.append(((rec or {}).get("finished") or _mtime(d), d))
    return [d for _, d in sorted(dated, key=lambda t: t[0], reverse=True)]


def priors(store: Path, step: Step, same, limit: int = 2) -> list[tuple[Path, dict]]:
    """(folder, its _SUCCESS) of `step`'s finished earlier folders whose step.json passes
    `same`, the most recent first, at most `limit`: where a task may look up values it would
    compute the same (a spec's HINTS). A folder gc removes meanwhile is simply not found."""
    out = []
    for d in earlier(store, step, finished=True):
        try:
            ok = same(atomic.read_json(d / "step.json"))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            continue
        rec = success(d)
        if ok and rec is not None:
            out.append((d, rec))
            if len(out) == limit:
                break
    return out


def candidates(store: Path, step: Step, wanted: dict[str, int], limit: int = VARIANTS,
               partials: dict[str, int] | None = None) -> Found:
    """Where `wanted` (content key -> this step's shard) are in `step`'s earlier folders in
    the store (the same step name, another hash), the most recently finished first. Reads
    their marker indexes a marker at a time and keeps the hits only: O(wanted), not
    O(shards x folders). In the same pass, `partials` (partial key -> shard) finds the
    earlier shard a read-keyed task compares what it reads with: `found.hints`, the `prior`
    of each (engine/cutoff.same_as_before), in a spill file."""
    out = Found()
    out.markers, out.lock = SpilledDicts(max(wanted.values(), default=-1) + 1), threading.Lock()
    partials = partials or {}
    out.hints = SpilledDicts(max(partials.values(), default=-1) + 1, "curate-hints-")
    out.cost, out.mean = {}, None
    total = count = 0
    targets = set(wanted.values())
    first = True
    for d in earlier(store, step)[:limit]:
        if len(out) == len(wanted) and len(out.hints) == len(partials):
            break
        try:
            for i, m in _markers_of(d):
                usable = m.get("reusable", True) and "out_files" in m
                k = m.get("content_key")
                j = wanted.get(k) if k else None
                if j is not None and j not in out and usable:
                    out[j] = (d, i)
                    out.markers[j] = m
                k = m.get("partial_key")
                j = partials.get(k) if k else None
                if j is not None and j not in out.hints and usable and (h := hint((d, i, m))) is not None:
                    out.hints[j] = h
                if first and "cpu_seconds" in m:
                    total, count = total + m["cpu_seconds"], count + 1
                    if i in targets:
                        out.cost[i] = m["cpu_seconds"]
        except (FileNotFoundError, ValueError, RunError):
            continue
        first = False
    out.mean = total / count if count else None
    left = targets - set(out)
    out.cost = {i: c for i, c in out.cost.items() if i in left}
    return out


def link_earlier(store: Path, s: Step, running, keys: list[str], missing: list[int], fence: str,
                 partials: list[str | None] | None = None) -> tuple[int, Found, list[int]]:
    """Link into `s`'s folder the shards of `missing` whose content key an earlier folder of
    the step holds (`running`: shard -> marker, filled with theirs); with `partials` (each
    shard's partial key), `found.hints` holds the `prior` of the others. Returns (how many
    were linked, what was found, the shards left to compute)."""
    pk = {partials[i]: i for i in missing if partials and i < len(partials) and partials[i]}
    found = candidates(store, s, {keys[i]: i for i in missing}, partials=pk)
    hits = sorted(found.items())
    n = 0
    d = s.dir(store)
    prev = atomic.set_fence(fence)  # the markers' temporary names carry the run's fence
    try:
        # read_many holds at most 4 x threads results: the linked markers go to `running` (a spill) as they come.
        # On an object store a link is requests (a marker read, a HEAD a file, the new marker's PUT), each
        # tens of milliseconds: 32 in flight, as the shuffle reads keep; a local link is a system call
        threads = 8 if fs.is_local(d) else 32
        linked = fs.read_many(lambda h: link_shard(h[1][0], h[1][1], found.marker(h[0]), d, h[0]), hits, threads=threads)
        for (i, _), m in zip(hits, linked):
            if m is not None:
                running[i] = m
                n += 1
    finally:
        atomic.set_fence(prev)
        found.markers.close()
    return n, found, [i for i in missing if i not in running]


def _markers_of(d: Path):
    """(shard, marker) of a folder: its committed index a marker at a time, else its shard markers."""
    rec = success(d)
    if rec is not None and isinstance(rec.get("shards"), int) and rec.get("markers"):
        index = d / rec["markers"]
        if index.exists():
            yield from read_index(index, rec["shards"]).items()
            return
    yield from iter_markers(d)


def _is_hash(s: str) -> bool:
    return len(s) == 16 and all(c in "0123456789abcdef" for c in s)


def _mtime(d: Path) -> float:
    try:
        return (d / "step.json").stat().st_mtime
    except (OSError, AttributeError):
        return 0.0


def link_shard(old: Path, index_old: int, marker: dict, new: Path, index: int) -> dict | None:
    """Shard `index_old` of folder `old` as shard `index` of folder `new`: its files linked
    (copied server-side on object stores) under their names, the old shard name made the new
    one (`part-00004` -> `part-00005`, for a position-free step whose shard moved), its
    marker written with `old`'s paths made `new`'s. None when a file is gone (a gc since):
    the files linked before it are removed, and the shard is computed instead."""
    a, b = shard_name(index_old), shard_name(index)
    names = {rel: renamed(rel, a, b) for rel in marker["out_files"]}
    refs = fs.link_all((old / rel, new / to) for rel, to in names.items())  # all or none of its files
    if refs is None:
        return None
    data = orjson.dumps(marker).replace(json_str(old), json_str(new))
    m = orjson.loads(data)
    if a != b:  # paths into the folder that name the shard
        root = str(new) + "/"
        m = {k: (renamed(v, a, b) if isinstance(v, str) and v.startswith(root) else v) for k, v in m.items()}
    m["out_files"] = {names[rel]: d for rel, d in marker["out_files"].items()}
    m.pop("refs", None)
    if refs:  # an object store: the files are the earlier objects, named here (fs.ref_target), not copied
        m["refs"] = {to: refs[str(new / to)] for to in names.values()}
    m["reused_from"] = old.name
    atomic.write_json(new / MARKERS / f"{shard_name(index)}.json", m)
    return m


def preview(step: Step, steps: list[Step], store: Path, stats: dict) -> tuple[int, int] | None:
    """(shards, of which reused) for `curate plan`: the step's shards planned from its
    committed inputs (`stats`: step name -> markers of a committed step, KeyError for one
    that is not, read once by the caller), their keys looked up in its earlier folders. None
    when a step it reads is not committed (its shards' keys depend on the bytes it will write)."""
    from pipeline.engine.markers import pinned

    keys = Keys(store, steps, stats)
    keys.begin(step)
    try:
        for i in step.inputs:
            stats[i.name]
        with pinned():
            ks = [keys.key(step, k, spec) for k, spec in enumerate(step.shards(step, stats))]
    except KeyError:  # the plan reads a step that has not run
        return None
    found = candidates(store, step, {k: i for i, k in enumerate(ks)})
    found.markers.close()
    found.hints.close()
    return len(ks), len(found)
