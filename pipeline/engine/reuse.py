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
store, a server-side copy: no document byte passes through the driver) and its marker
copied with the old folder's paths rewritten.

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
    found = candidates(store, step)              # key -> (folder, shard, marker)
    if k in found: marker = link_shard(*found[k], step.dir(store), 3)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import orjson

from pipeline.engine.step import MARKERS, Step, hash_json, read_markers, shard_name, success
from pipeline.io import atomic, fs

KEY_CHARS = 32  # of the sha256: 128 bits, no two shard contents share one in any store
VARIANTS = 8  # earlier folders of a step searched for reusable shards (the most recently finished)


class Keys:
    """Content keys of shards: a spec's store paths replaced by the digests of their bytes."""

    def __init__(self, store: Path, steps: Iterable[Step], stats: dict):
        self.root = str(fs.path(store) / "steps").rstrip("/") + "/"
        self.store = fs.path(store)
        self.by_folder = {s.dir(self.store).name: s for s in steps}
        self.stats = stats
        self._files: dict[str, dict[str, str] | None] = {}
        self._folders: dict[tuple[str, str], str] = {}
        self._inner = re.compile(re.escape(self.root) + r"[^'\"\s,\]\}\)]+")

    def key(self, step: Step, index: int, spec: dict) -> str:
        own = step.dir(self.store).name
        body = self._digested(spec, own)
        return hash_json({"config": step.shard_config_hash, "code": step.code_hash, "shard": index,
                          "spec": body})[:KEY_CHARS]

    def forget(self, step: Step) -> None:
        """Drop a step's file table (the driver holds the tables of the steps being planned)."""
        self._files.pop(step.dir(self.store).name, None)
        self._folders = {k: v for k, v in self._folders.items() if k[0] != step.dir(self.store).name}

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
            pre = rel + "/" if rel else ""
            self._folders[memo] = "folder:" + hash_json(sorted((k, d) for k, d in table.items() if k.startswith(pre)))
        return self._folders[memo]

    def _table(self, folder: str) -> dict[str, str] | None:
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


class Found(dict):
    """key -> (folder, shard, marker) of earlier shards; `cost`: shard -> the CPU seconds it
    took in the most recent earlier folder (what computing it again is likely to cost)."""

    cost: dict[int, float]


def candidates(store: Path, step: Step, limit: int = VARIANTS) -> Found:
    """key -> (folder, shard, marker) of the shards of `step`'s earlier folders in the store
    (the same step name, another hash), the most recently finished first."""
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
        dated.append(((rec or {}).get("finished") or _mtime(d), d))
    out = Found()
    out.cost = {}
    for _, d in sorted(dated, key=lambda t: t[0], reverse=True)[:limit]:
        try:
            markers = read_markers(d)
        except (FileNotFoundError, ValueError):
            continue
        if not out.cost:
            out.cost = {i: m.get("cpu_seconds", 0.0) for i, m in markers.items()}
        for i, m in markers.items():
            k = m.get("content_key")
            if k and k not in out and m.get("reusable", True) and "out_files" in m:
                out[k] = (d, i, m)
    return out


def _is_hash(s: str) -> bool:
    return len(s) == 16 and all(c in "0123456789abcdef" for c in s)


def _mtime(d: Path) -> float:
    try:
        return (d / "step.json").stat().st_mtime
    except (OSError, AttributeError):
        return 0.0


def link_shard(old: Path, index_old: int, marker: dict, new: Path, index: int) -> dict | None:
    """Shard `index_old` of folder `old` as shard `index` of folder `new`: its files linked
    (copied server-side on object stores), its marker written with `old`'s paths made
    `new`'s. None when a file is gone (a gc since): the shard is computed instead."""
    if index != index_old:
        return None
    try:
        for rel in marker["out_files"]:
            src, dst = old / rel, new / rel
            fs.makedirs(dst.parent)
            if fs.is_local(dst) and os.path.lexists(dst):
                os.unlink(dst)  # a link a stopped run made: the same bytes
            fs.link_or_copy(src, dst)
    except FileNotFoundError:
        return None
    data = orjson.dumps(marker).replace(_json_str(old), _json_str(new))
    m = orjson.loads(data)
    m["reused_from"] = old.name
    atomic.write_json(new / MARKERS / f"{shard_name(index)}.json", m)
    return m


def _json_str(p: Path) -> bytes:
    return orjson.dumps(str(p))[1:-1]
