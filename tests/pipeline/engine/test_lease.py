"""Leases (pipeline/engine/lease.py): one holder at a time, expiry, takeover by exactly one run."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import orjson

from pipeline.engine.lease import Leases, holder, identity


def _plant(d, gen: int, **rec) -> None:
    d.mkdir(parents=True, exist_ok=True)
    base = {"run": "elsewhere-run", "name": "other", "host": "another-host", "pid": 1, "renewed": time.time(), "ttl": 5}
    (d / f"gen-{gen:06d}.json").write_bytes(orjson.dumps({**base, **rec}))


def test_one_holder_at_a_time_and_release_frees_it(tmp_path):
    a, b = Leases(name="a"), Leases(name="b")
    d = tmp_path / "step"
    assert a.acquire(d) is None and a.acquire(d) is None  # held, and asking again is fine
    rec = b.acquire(d)
    assert rec is not None and rec["run"] == a.run_id and rec["pid"] == os.getpid()
    a.release(d)
    assert holder(d) is None and b.acquire(d) is None
    assert holder(d)["run"] == b.run_id
    b.release_all()


def test_an_expired_lease_is_taken_over_and_its_holder_learns_it_lost(tmp_path):
    d = tmp_path / "step"
    _plant(d, 1, renewed=time.time() - 3)  # another machine, renewed 3 s ago, ttl 5: live
    me = Leases(name="me", ttl=5)
    assert me.acquire(d)["run"] == "elsewhere-run"
    _plant(d, 1, renewed=time.time() - 6)  # not renewed for longer than its ttl
    assert me.acquire(d) is None
    assert sorted(p.name for p in d.iterdir()) == ["gen-000001.json", "gen-000002.json"]
    # the old holder, had it been paused rather than dead, finds a later generation and stops
    old = Leases(run_id="elsewhere-run", ttl=5)
    old.held[str(d)] = 1
    old.renew()
    assert str(d) not in old.held and old.lost[str(d)]["run"] == me.run_id
    me.release_all()


def test_a_holder_that_died_on_this_machine_is_taken_over_at_once(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # a pid that no longer exists
    d = tmp_path / "step"
    here = identity()
    _plant(d, 1, **{**here, "pid": p.pid, "start": "1"}, ttl=600)
    me = Leases(name="me")
    assert me.acquire(d) is None  # no 600 s wait: the holder's process is gone
    me.release_all()


def test_a_holder_is_dead_only_when_certain_not_by_pid_alone(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    here = identity()
    me = Leases(name="me")
    # another container with host networking: same hostname and kernel, another PID namespace,
    # where the pid means nothing here: live until its renewals stop
    _plant(tmp_path / "a", 1, **{**here, "pid": p.pid, "pidns": "pid:[4026599999]"}, ttl=600)
    assert me.acquire(tmp_path / "a")["run"] == "elsewhere-run"
    # a record without the process identity (written by an older version): renewal time only
    _plant(tmp_path / "b", 1, host=here["host"], pid=p.pid, ttl=600)
    assert me.acquire(tmp_path / "b")["run"] == "elsewhere-run"
    # the pid exists again but belongs to a process started at another time (a reused pid): dead
    _plant(tmp_path / "c", 1, **{**here, "start": "1"}, ttl=600)
    assert me.acquire(tmp_path / "c") is None
    # this very process, same start time: live
    _plant(tmp_path / "d", 1, **here, ttl=600)
    assert me.acquire(tmp_path / "d")["run"] == "elsewhere-run"
    me.release_all()


def test_a_generation_is_never_used_twice(tmp_path):
    d = tmp_path / "step"
    a, b = Leases(name="a"), Leases(name="b")
    assert a.acquire(d) is None
    fa = a.fence(d)
    a.release(d)  # a tombstone, not a deletion: the next holder takes generation 2
    assert b.acquire(d) is None and b.fence(d) != fa and b.fence(d).endswith("g2")
    assert sorted(p.name for p in d.iterdir()) == ["gen-000001.json", "gen-000002.json"]
    assert orjson.loads((d / "gen-000001.json").read_bytes())["released"] is True
    b.release_all()


def test_the_holder_renews_its_lease_while_it_works(tmp_path):
    d = tmp_path / "step"
    me = Leases(name="me", ttl=1.2)
    assert me.acquire(d) is None
    first = holder(d)["renewed"]
    time.sleep(2.0)  # longer than the ttl: only renewals keep it live
    rec = Leases(name="other", ttl=1.2).acquire(d)
    assert rec is not None and rec["run"] == me.run_id and rec["renewed"] > first
    me.release_all()


def _race(args):
    d, q = args
    return Leases(name=f"racer-{os.getpid()}").acquire(d) is None


def test_of_eight_processes_taking_over_one_expired_lease_exactly_one_wins(tmp_path):
    d = tmp_path / "step"
    _plant(d, 1, renewed=time.time() - 60)
    with mp.get_context("spawn").Pool(8) as pool:
        won = pool.map(_race, [(str(d), i) for i in range(8)])
    assert sum(won) == 1, won
    assert sorted(p.name for p in d.iterdir() if p.name.startswith("gen-")) == ["gen-000001.json", "gen-000002.json"]


def test_exclusive_create_on_a_filesystem_that_ignores_mode(tmp_path):
    """Issue 51, item 9: a backend whose `pipe_file` accepts mode="create" and ignores it (obstore's
    adapter, old gcsfs, S3-compatible servers without If-None-Match) is found out by a probe, and
    the second taker of a lease or a commit does not win; one that honours it still uses it."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    from pipeline.engine import lease

    class IgnoresMode(MemoryFileSystem):
        protocol = "ignoresmode"
        store: dict = {}
        pseudo_dirs = [""]

        def pipe_file(self, path, value, mode="overwrite", **kw):
            return super().pipe_file(path, value, **kw)  # mode dropped: every write overwrites

    fsspec.register_implementation("ignoresmode", IgnoresMode, clobber=True)
    target = "ignoresmode://bucket/leases/step/gen-1.json"
    assert lease.create_exclusive(target, b"first") is True
    assert lease.create_exclusive(target, b"second") is False
    assert fsspec.filesystem("ignoresmode").cat_file(target) == b"first"
    assert lease._HONOURS[("IgnoresMode", "bucket")] is False
    assert not [p for p in IgnoresMode.store if ".create-probe" in p]  # the probe removed
    honest = "memory://bucket2/leases/step/gen-1.json"
    assert lease.create_exclusive(honest, b"a") is True and lease.create_exclusive(honest, b"b") is False
    assert lease._HONOURS[("MemoryFileSystem", "bucket2")] is True
