"""Leases: one run at a time computes a step of the shared store, or writes a run directory.

Mixture files that share a store (pipeline/run/runner.py) can run at the same moment and need
the same new step. Without coordination both would compute it, and one run's cleanup of
temporary files could remove the other's. A lease says who is computing it:

    <store>/_leases/<step>-<hash8>/gen-000001.json   {"run", "host", "pid", "renewed", "ttl", ...}
    <run dir>/_lease/gen-000001.json                 the run directory's own lease

The holder renews its file every `ttl / 4` seconds from a thread. A lease is live while it
was renewed within `ttl` seconds (`CURATE_LEASE_SECONDS`, default 60) and, on this host,
while its process exists (a run killed with SIGKILL frees its leases at once on the same
machine, after `ttl` elsewhere). Taking over an expired lease creates the next generation
file; creation is exclusive (a hard link, which fails if the name exists), so of two runs
taking over the same lease exactly one wins, with no compare-and-swap needed. A holder that
finds a later generation than its own has lost the lease (it paused longer than `ttl`) and
stops. Expiry compares the holder's clock with the reader's: the machines of a cluster must
agree to well under `ttl` (NTP does). On object stores the creation is a conditional write
(S3's `If-None-Match: *`, through fsspec's `mode="create"`); a filesystem without one falls
back to a check then a write, where two runs starting the same step in the same instant may
both compute it (the bytes are the same: writes are atomic and deterministic).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import orjson

from pipeline.io import atomic, fs

DEFAULT_TTL = 60.0


def ttl_seconds() -> float:
    try:
        return max(1.0, float(os.environ.get("CURATE_LEASE_SECONDS", DEFAULT_TTL)))
    except ValueError:
        return DEFAULT_TTL


def _gens(d) -> list[int]:
    d = fs.path(d)
    fs.refresh(d)  # another run's generations, not a cached listing
    try:
        names = [p.name for p in d.iterdir()]
    except (FileNotFoundError, NotADirectoryError):  # never made, or released while we looked
        return []
    out = []
    for n in names:
        if n.startswith("gen-") and n.endswith(".json"):
            try:
                out.append(int(n[4:-5]))
            except ValueError:
                pass
    return sorted(out)


def _name(gen: int) -> str:
    return f"gen-{gen:06d}.json"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def holder(d) -> dict | None:
    """The live holder of the lease in `d` (its record), or None when it is free or expired."""
    gens = _gens(d)
    if not gens:
        return None
    try:
        rec = atomic.read_json(fs.path(d) / _name(gens[-1]))
    except (FileNotFoundError, ValueError):
        return None  # being written, or removed by a release: free
    return rec if live(rec) else None


def live(rec: dict) -> bool:
    if time.time() - rec.get("renewed", 0) > rec.get("ttl", DEFAULT_TTL):
        return False
    if rec.get("host") == socket.gethostname() and rec.get("pid") and not _pid_alive(int(rec["pid"])):
        return False  # the holder died on this machine: no need to wait for the expiry
    return True


def _create_exclusive(path, data: bytes) -> bool:
    """Write `path` only if it does not exist; True if this call created it."""
    path = fs.path(path)
    fs.makedirs(path.parent)
    if fs.is_local(path):
        tmp = fs.tmp_path(path)
        tmp.write_bytes(data)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
    try:  # a conditional write (S3: If-None-Match: *; any fsspec filesystem with mode="create")
        path.fs.pipe_file(path.path, data, mode="create")
        return True
    except FileExistsError:
        return False
    except (TypeError, NotImplementedError):  # a filesystem without exclusive creation
        pass
    if path.exists():
        return False
    atomic.write_bytes(path, data)
    return True


def describe(rec: dict) -> str:
    who = rec.get("name") or "?"
    age = time.time() - rec.get("renewed", 0)
    return f"run {who} ({rec.get('run', '?')[:8]}, host {rec.get('host')}, pid {rec.get('pid')}, renewed {age:.0f}s ago)"


class Leases:
    """The leases one run holds, renewed from a daemon thread until released."""

    def __init__(self, run_id: str | None = None, name: str = "", ttl: float | None = None):
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.name = name
        self.ttl = ttl if ttl is not None else ttl_seconds()
        self.held: dict[str, int] = {}  # lease directory -> generation
        self.lost: dict[str, dict] = {}  # lease directory -> the record that replaced ours
        self.took_over: dict[str, dict] = {}  # lease directory -> the expired record we replaced
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self) -> bytes:
        now = time.time()
        return orjson.dumps({"run": self.run_id, "name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
                             "renewed": now, "ttl": self.ttl})

    def acquire(self, d) -> dict | None:
        """Take the lease in `d`. Returns None when this run holds it, else the live holder's record."""
        d = str(d)
        if d in self.held:
            return None
        for _ in range(8):  # lose a race for a generation: look again
            gens = _gens(d)
            rec = None
            if gens:
                try:
                    rec = atomic.read_json(fs.path(d) / _name(gens[-1]))
                except (FileNotFoundError, ValueError):
                    rec = None
                if rec is not None and live(rec):
                    return rec
            gen = (gens[-1] if gens else 0) + 1
            if _create_exclusive(fs.path(d) / _name(gen), self._record()):
                with self._lock:
                    self.held[d] = gen
                if rec is not None:
                    self.took_over[d] = rec
                self._start()
                return None
        return holder(d) or {"run": "?", "host": "?", "pid": None, "renewed": time.time()}

    def release(self, d) -> None:
        d = str(d)
        with self._lock:
            gen = self.held.pop(d, None)
        if gen is not None and _gens(d) and _gens(d)[-1] == gen:
            fs.rmtree(d)  # free: the next run creates generation 1 again

    def release_all(self) -> None:
        for d in list(self.held):
            try:
                self.release(d)
            except OSError:
                pass
        self._stop.set()

    def renew(self) -> None:
        with self._lock:
            items = list(self.held.items())
        for d, gen in items:
            try:
                gens = _gens(d)
                if gens and gens[-1] > gen:  # someone took it over: we paused past the expiry
                    self.lost[d] = atomic.read_json(fs.path(d) / _name(gens[-1]))
                    with self._lock:
                        self.held.pop(d, None)
                    continue
                with self._lock:
                    if d not in self.held:
                        continue
                atomic.write_bytes(fs.path(d) / _name(gen), self._record())
            except (OSError, ValueError):
                pass  # a missed renewal; the next one comes in ttl / 4

    def _start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="curate-leases", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            self.renew()
