"""Leases: one run at a time computes a step of the shared store, or writes a run directory.

Mixture files that share a store (pipeline/run/runner.py) can run at the same moment and need
the same new step. Without coordination both would compute it, and one run's cleanup of
temporary files could remove the other's. A lease says who is computing it:

    <store>/_leases/<step>-<hash16>/gen-000001.json   {"run", "host", "pid", "boot", "pidns", "start", "renewed", "ttl"}
    <run dir>/_lease/gen-000001.json                  the run directory's own lease

The holder renews its file every `ttl / 4` seconds from a thread. A lease is live while it
was renewed within `ttl` seconds (`CURATE_LEASE_SECONDS`, default 60). A holder that died is
seen at once only where that is certain: on the same machine (same kernel boot id), in the
same PID namespace, when its pid is gone or now belongs to a process started at another time;
a holder in another container that shares the hostname is live until its renewals stop.
Taking over an expired lease creates the next generation file; creation is exclusive (a hard
link, which fails if the name exists; on object stores a conditional write, S3's
`If-None-Match: *` through fsspec's `mode="create"`), so of two runs taking over the same
lease exactly one wins. A release leaves a tombstone in its generation file, so a generation
number is never used twice.

Fencing, by place: a holder's temporary files carry its fence (`<run id>g<generation>`,
unique for ever), its cleanup removes only those, and its commit is the exclusive creation of
the step's `_SUCCESS`, naming the fence whose marker index it commits (executor.py). A holder
that paused past `ttl` (Ctrl-Z, a long GC pause) finds a later generation when it renews or
commits: it stops with an error and deletes nothing. Expiry compares the holder's clock with
the reader's: the machines of a cluster must agree to well under `ttl` (NTP does). A
filesystem without exclusive creation falls back to a check then a write.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid

import orjson

from pipeline.io import atomic, fs

DEFAULT_TTL = 60.0


class LeaseLost(Exception):
    """This run's generation of a lease was replaced by another run's (it paused past the ttl)."""

    def __init__(self, d, rec: dict):
        self.dir, self.rec = str(d), rec
        super().__init__(f"lost the lease {fs.path(d).name} to {describe(rec)}")


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


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot), or None when there is no such process."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]  # field 22; the name in parentheses may hold spaces


def _pidns() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def identity() -> dict:
    """This process, as a lease record names it: a pid alone is ambiguous across containers
    (PID namespaces) and reboots, and is reused."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "boot": _read("/proc/sys/kernel/random/boot_id"),
            "pidns": _pidns(), "start": _start_time(pid)}


def _gone(rec: dict) -> bool:
    """True only when the holder's process certainly no longer exists: same machine, same boot,
    same PID namespace, and its pid gone or taken by a later process."""
    me = identity()
    if not rec.get("pid") or rec.get("host") != me["host"] or me["boot"] is None:
        return False
    if rec.get("boot") != me["boot"] or rec.get("pidns") != me["pidns"]:
        return False
    start = _start_time(int(rec["pid"]))
    return start is None or (rec.get("start") is not None and start != rec["start"])


def last_record(d) -> dict | None:
    """The newest generation's record in `d`, live or not; None when there is none (yet)."""
    gens = _gens(d)
    if not gens:
        return None
    try:
        return atomic.read_json(fs.path(d) / _name(gens[-1]))
    except (FileNotFoundError, ValueError):
        return None


def holder(d) -> dict | None:
    """The live holder of the lease in `d` (its record), or None when it is free or expired."""
    rec = last_record(d)
    return rec if rec is not None and live(rec) else None


def live(rec: dict) -> bool:
    if rec.get("released"):
        return False
    if time.time() - rec.get("renewed", 0) > rec.get("ttl", DEFAULT_TTL):
        return False
    return not _gone(rec)  # the holder died here: no need to wait for the expiry


def create_exclusive(path, data: bytes) -> bool:
    """Write `path` only if it does not exist; True if this call created it."""
    path = fs.path(path)
    fs.makedirs(path.parent)
    if fs.is_local(path):
        tmp = atomic.tmp_path(path)
        tmp.write_bytes(data)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
    if _honours_create(path):
        try:  # a conditional write (S3: If-None-Match: *; any fsspec filesystem with mode="create")
            path.fs.pipe_file(path.path, data, mode="create")
            return True
        except FileExistsError:
            return False
    # no exclusive creation (or one that accepts mode="create" and ignores it): a check, a write,
    # and a read-back (two takers in the same instant may both see their own bytes: double work)
    if path.exists():
        return False
    atomic.write_bytes(path, data)
    return path.read_bytes() == data


_HONOURS: dict[tuple, bool] = {}


def _honours_create(path) -> bool:
    """Whether the filesystem under `path` refuses a second `pipe_file(mode="create")` of one
    object, checked once per filesystem and bucket with a probe object: some backends accept the
    argument and ignore it (obstore's adapter, old gcsfs, S3-compatible servers without
    If-None-Match), and every caller would then win a lease or a commit."""
    key = (type(path.fs).__name__, str(path).split("://", 1)[-1].lstrip("/").split("/", 1)[0])  # its kind and bucket
    if key not in _HONOURS:
        probe = path.parent / f".create-probe-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        ok = False
        try:
            path.fs.pipe_file(probe.path, b"1", mode="create")
            try:
                path.fs.pipe_file(probe.path, b"2", mode="create")
            except FileExistsError:
                ok = True
        except (TypeError, NotImplementedError, ValueError):  # no exclusive creation at all
            ok = False
        finally:
            try:
                path.fs.rm_file(probe.path)
            except (FileNotFoundError, OSError):
                pass
        _HONOURS[key] = ok
    return _HONOURS[key]


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
        self._me = identity()
        self._renewed_at = time.monotonic()  # the last time every lease held was written fresh
        self._lapsed = False  # a gap past the ttl between two renewals: others may have seen our leases expire

    def lapsed(self) -> bool:
        """Whether this process went longer than the ttl without renewing (paused: Ctrl-Z, a
        stalled machine, a stop-the-world pause): another process may have judged its leases
        expired and acted on it, even if none was taken over."""
        return self._lapsed or time.monotonic() - self._renewed_at > self.ttl

    def _record(self, **extra) -> bytes:
        return orjson.dumps({"run": self.run_id, "name": self.name, **self._me, "renewed": time.time(), "ttl": self.ttl,
                             **extra})

    def fence(self, d) -> str:
        """The fence token of the generation this run holds in `d`: unique for ever (the run id
        is random, the generation never reused), letters and digits (it names temporary files)."""
        return f"{re.sub(r'[^A-Za-z0-9]', '', self.run_id)}g{self.held[str(d)]}"

    def check(self, d) -> None:
        """Raise LeaseLost when a later generation replaced ours in `d` (read now, not at the
        next renewal: a holder resumed after a pause must not commit on a stale belief)."""
        d = str(d)
        gen = self.held.get(d)
        gens = _gens(d)
        if gen is None or not gens or gens[-1] != gen:  # taken over, or the entry removed (a gc while we were paused)
            rec = self.lost.get(d)
            if rec is None and gens:
                try:
                    rec = atomic.read_json(fs.path(d) / _name(gens[-1]))
                except (FileNotFoundError, ValueError):
                    rec = None
            with self._lock:
                self.held.pop(d, None)
            raise LeaseLost(d, rec or {"run": "?"})

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
            if create_exclusive(fs.path(d) / _name(gen), self._record()):
                with self._lock:
                    if not self.held:
                        self._renewed_at = time.monotonic()
                    self.held[d] = gen
                if rec is not None and not rec.get("released"):
                    self.took_over[d] = rec
                self._start()
                return None
        return holder(d) or {"run": "?", "host": "?", "pid": None, "renewed": time.time()}

    def release(self, d, forget: bool = False) -> None:
        """Free the lease: a tombstone in our generation file (the next holder takes the next
        generation), or, with `forget`, the whole lease directory (one no other run names)."""
        d = str(d)
        with self._lock:
            gen = self.held.pop(d, None)
        if gen is not None and _gens(d) and _gens(d)[-1] == gen:
            if forget:
                fs.rmtree(d)
            else:
                atomic.write_bytes(fs.path(d) / _name(gen), self._record(released=True))

    def release_all(self) -> None:
        for d in list(self.held):
            try:
                self.release(d)
            except OSError:
                pass
        self._stop.set()

    def renew(self) -> None:
        if time.monotonic() - self._renewed_at > self.ttl:
            self._lapsed = True
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
                if not gens or gens[-1] < gen:  # our entry removed (a gc judged it dead while we were paused):
                    with self._lock:  # never recreated by a renewal; lost, unless we released it meanwhile
                        if d not in self.held:
                            continue
                        self.held.pop(d, None)
                    self.lost[d] = {"run": "gc", "name": "curate gc", "host": "?", "pid": None, "renewed": time.time(),
                                    "removed": True}
                    continue
                with self._lock:
                    if d not in self.held:
                        continue
                atomic.write_bytes(fs.path(d) / _name(gen), self._record())
            except (OSError, ValueError):
                pass  # a missed renewal; the next one comes in ttl / 4
        self._renewed_at = time.monotonic()

    def _start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="curate-leases", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            self.renew()
