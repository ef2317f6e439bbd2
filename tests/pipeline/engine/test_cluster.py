"""Real clusters on this machine: several Ray nodes, faults in the middle of a run, and
`ray job submit` against a head started with `ray start --head` and token auth.

Every run here is the demo mixture of tests/conftest.py (`demo_run_yaml`) and must give the
bytes of the session's clean 2-worker run (`demo_run`), with the ledger balanced; but for
the job submitted to a head and the fault-free three-node run, whose point is where the run
runs, not how long: they run tests/conftest.py's small mixture and must give the bytes of its
clean run (`small_run`). The tests print what they killed and when."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.io import atomic
from tests.conftest import ROOT, curate, free_port, local_cluster, mixture_shas, small_mixture, write_yaml

pytestmark = pytest.mark.timeout(900)

# the steps that read a shuffle's partitions (shards.shuffle.read_partition), by folder name
SHUFFLE_REDUCERS = r"dedup-(exact-reduce|fuzzy-buckets|fuzzy-verify|fuzzy-clusters|paragraph-reduce)-[0-9a-f]+$"


# ---------------------------------------------------------------- helpers


def _assert_same_as_clean(run_dir: Path, clean: Path):
    assert mixture_shas(run_dir) == mixture_shas(clean), "the mixture differs from the clean run's"
    import hashlib

    for p, sha in mixture_shas(run_dir).items():  # the files themselves, not only the manifest's word
        assert hashlib.sha256((run_dir / p).read_bytes()).hexdigest() == sha
    led, ref = (atomic.read_json(d / "ledger.json")["sources"] for d in (run_dir, clean))
    assert led == ref and all(v["conservation"] is True for v in led.values())


def _markers(run_dir: Path) -> dict[str, int]:
    return {str(p.relative_to(run_dir)): p.stat().st_mtime_ns for p in (run_dir / "steps").glob("*/_markers/*.json")}


def _wait_for(pred, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.time() + timeout
    while not pred():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}")
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _procs() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process (Ray workers rename themselves
    `ray::<task>` while they run one)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(d.name)] = (ppid, cmd)
    return out


def _descends(pid: int, ancestor: int, procs: dict) -> bool:
    while pid in procs and pid > 1:
        if pid == ancestor:
            return True
        pid = procs[pid][0]
    return False


def _start(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    e = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    e.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "pipeline", *args], env=e, start_new_session=True,
                            stdout=open(log.with_suffix(".out"), "w"), stderr=open(log.with_suffix(".err"), "w"))


def _finish(proc: subprocess.Popen, log: Path, timeout: int = 600) -> str:
    proc.wait(timeout=timeout)
    err = log.with_suffix(".err").read_text()
    assert proc.returncode == 0, err[-3000:]
    return err


def _reap(tmp: Path, timeout: float = 20) -> list:
    """Stop every process whose command line names `tmp` (a head's raylet and agents run in
    sessions of their own, so a process-group kill does not reach them); what is left after
    `timeout`, for the test to fail on."""
    deadline = time.time() + timeout
    while True:
        left = [(p, cmd[:100]) for p, (_, cmd) in _procs().items() if str(tmp) in cmd]
        if not left or time.time() > deadline:
            return left
        for p, _ in left:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def _short_tmp(prefix: str) -> Path:
    # Ray's socket paths must stay under 107 bytes: pytest's tmp dirs are too deep
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


# ---------------------------------------------------------------- an embedded Ray, one process at a time


@pytest.fixture(scope="module")
def faulted(demo_run_yaml, tmp_path_factory, joined_1cpu):
    """One run of the demo from scratch with three faults in turn, then its resume: a worker
    SIGKILLed inside a shard once the filters run (Ray retries the shard), another while a dedup
    shuffle's reducers run (mid-shuffle), then the driver SIGKILLed once dedup is under way
    (resumed with 1 worker). The three tests below read it: their faults come one after the
    other in one run instead of one run each."""
    tmp_path = tmp_path_factory.mktemp("faults")
    run_dir = tmp_path / "demo"
    log = tmp_path / "first"
    t0 = time.time()
    proc = _start(["run", str(demo_run_yaml), "--workers", "2", "--output", str(tmp_path)], log)
    out = {"run_dir": run_dir}

    def kill_worker_while(step_re: str, what: str):
        """SIGKILL a worker of this run running a task (`ray::run_shard`) while a step whose folder
        matches `step_re` is unfinished; -> (pid, seconds since start, the steps unfinished then)."""
        def unfinished() -> list[str]:
            return sorted(p.parent.name for p in (run_dir / "steps").glob("*/step.json") if not (p.parent / "_SUCCESS").exists())

        def victim() -> tuple[int, list[str]] | None:
            steps = unfinished()
            if not [s for s in steps if re.match(step_re, s)]:
                return None
            procs = _procs()
            for p, (_, cmd) in procs.items():
                if cmd.startswith("ray::run_shard") and _descends(p, proc.pid, procs):
                    return p, steps
            return None

        while True:  # the task seen may finish before the kill, or the step before it: look again
            found: list = []
            _wait_for(lambda: found.append(victim()) or found[-1] is not None, 300, what, proc)
            pid, running = found[-1]
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            if [s for s in running if re.match(step_re, s) and not (run_dir / "steps" / s / "_SUCCESS").exists()]:
                return pid, time.time() - t0, running  # the matching step was still unfinished when the worker died

    # fault 1: a worker of this run inside a shard, once the filters run (the slowest per-document step)
    out["worker"] = kill_worker_while(r"filter-web-", "a worker running a shard")
    # fault 2: a worker mid-shuffle, while a reducer of a dedup shuffle (exact, fuzzy or paragraph) is
    # unfinished: its partition's reads and writes are redone by Ray's retry, the output the same bytes
    _wait_for(lambda: all((run_dir / "steps" / s / "_SUCCESS").exists() for s in out["worker"][2]), 300,
              "every step unfinished at the first worker's death done", proc)
    out["shuffle_worker"] = kill_worker_while(SHUFFLE_REDUCERS, "a worker running a task of a dedup shuffle's reducers")
    running = out["worker"][2] + out["shuffle_worker"][2]

    # fault 3: the driver, mid-run: dedup under way, with some of its shards done and others not, and
    # every step that was unfinished when either worker died finished by this driver (so the killed
    # tasks, whichever steps they were in, were retried: _wait_for fails if the run ends first)
    def half_done() -> list[str]:  # steps under way: some shards done (markers), not committed
        return [p.name for p in (run_dir / "steps").glob("*") if any((p / "_markers").glob("*.json"))
                and not (p / "_SUCCESS").exists()]

    _wait_for(lambda: list((run_dir / "steps").glob("dedup-fuzzy-signatures-*/_markers/*.json"))
              and all((run_dir / "steps" / s / "_SUCCESS").exists() for s in running) and half_done(), 300,
              "the first fuzzy-dedup shard, every step unfinished at the workers' deaths done, a step half done", proc)
    out["filters_done"] = {p.name: (p / "_SUCCESS").exists() for p in (run_dir / "steps").glob("filter-*")}
    out["running_done"] = {s: (run_dir / "steps" / s / "_SUCCESS").exists() for s in running}
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = time.time() - t0
    time.sleep(1.0)
    try:  # the embedded Ray it started is orphaned: stop what is left, as `ray stop` would
        os.killpg(proc.pid, signal.SIGKILL)
        orphans = "its orphaned Ray processes stopped"
    except ProcessLookupError:
        orphans = "no Ray process outlived it"
    out["driver"] = (proc.pid, killed_at, orphans)
    out["before"] = _markers(run_dir)
    out["done_steps"] = sorted(p.parent.name for p in (run_dir / "steps").glob("*/_SUCCESS"))
    out["partial"] = sorted(p.parent.name for p in (run_dir / "steps").glob("*/step.json") if not (p.parent / "_SUCCESS").exists())
    # resumed with a different worker count (the session's Ray of 1 CPU: the killed run's own Ray is
    # gone, and a fresh embedded one would cost its start): the split into shards never depends on it
    r = curate("run", str(demo_run_yaml), "--workers", "1", "--output", str(tmp_path), env=joined_1cpu, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out["after"] = _markers(run_dir)
    out["finished_at"] = time.time() - t0
    return out


def test_killing_a_worker_in_the_middle_of_a_shard_is_retried(faulted, demo_run):
    pid, at, running = faulted["worker"]
    print(f"\nSIGKILLed worker pid {pid} (ray::run_shard) at {at:.1f}s; unfinished steps then: {', '.join(running)}")
    # the same driver went on past the killed shard: every filter step finished (dedup reads them all),
    # and so did every step unfinished when the worker died, the killed shard's among them
    assert faulted["filters_done"] and all(faulted["filters_done"].values()), faulted["filters_done"]
    assert running and all(faulted["running_done"].values()), faulted["running_done"]
    _assert_same_as_clean(faulted["run_dir"], demo_run)
    print(f"run finished at {faulted['finished_at']:.1f}s (after a resume: the next test); mixture identical to the clean run; "
          "conservation holds")


def test_killing_a_worker_mid_shuffle_is_retried(faulted, demo_run):
    pid, at, running = faulted["shuffle_worker"]
    reducers = [s for s in running if re.match(SHUFFLE_REDUCERS, s)]
    print(f"\nSIGKILLed worker pid {pid} (ray::run_shard) at {at:.1f}s, a shuffle's reducers unfinished ({', '.join(reducers)}); "
          f"unfinished steps then: {', '.join(running)}")
    # the reducer step was under way when its worker died, and the same driver finished it (the retried
    # task re-read its partition from the map files); the mixture is the clean run's bytes
    assert reducers and all(faulted["running_done"][s] for s in reducers), faulted["running_done"]
    _assert_same_as_clean(faulted["run_dir"], demo_run)


def test_a_killed_driver_resumes_without_redoing_finished_shards(faulted, demo_run):
    run_dir, before, after = faulted["run_dir"], faulted["before"], faulted["after"]
    done_steps, partial = faulted["done_steps"], faulted["partial"]
    pid, killed_at, orphans = faulted["driver"]
    print(f"\nSIGKILLed the driver (pid {pid}) at {killed_at:.1f}s ({orphans}): {len(done_steps)} steps finished, "
          f"unfinished {partial}, {len(before)} shard markers on disk")
    assert before and partial
    redone = [m for m, t in before.items() if after.get(m) != t]
    assert not redone, f"finished shards were computed again: {redone[:5]}"
    steps = atomic.read_json(run_dir / "run.json")["steps"]
    skipped = sorted(n for n, s in steps.items() if s["status"] == "SKIPPED")
    assert len(skipped) == len(done_steps)
    print(f"rerun: {len(skipped)} steps skipped, {len(after) - len(before)} shards run of {len(after)}; "
          f"every earlier marker untouched; mixture identical to the clean run")
    _assert_same_as_clean(run_dir, demo_run)


# ---------------------------------------------------------------- ray job submit


def test_ray_job_submit_with_token_auth_gives_the_bytes_of_a_local_run(demo_corpus, small_run, tmp_path):
    ray_bin = Path(sys.executable).parent / "ray"
    yaml = write_yaml(tmp_path / "r.yaml", small_mixture(str(demo_corpus), "out"))
    tmp = _short_tmp("crj-")
    token = tmp / "token"
    token.write_text(os.urandom(32).hex())
    token.chmod(0o600)
    port, dash = free_port(), free_port()
    # a second Ray on this machine (the session's own) holds the default agent ports: give the head its own,
    # or its job agent never starts ("No available agent to submit job")
    agent_ports = [f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                            "runtime-env-agent-port", "metrics-export-port",
                                                            "ray-client-server-port")]
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN_PATH": str(token), "PATH": f"{ray_bin.parent}:{os.environ['PATH']}"}
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--block", "--num-cpus", "2", "--port", str(port),
                             "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--temp-dir", str(tmp / "ray"),
                             "--disable-usage-stats", *agent_ports], env=env, start_new_session=True,
                            stdout=open(tmp / "head.log", "w"), stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{dash}"
    t_head = time.time()
    try:
        def up() -> bool:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{api}/api/version"), timeout=1)
                return True
            except urllib.error.HTTPError:
                return True  # answering (perhaps 401): the server is up
            except OSError:
                return False

        _wait_for(up, 90, "the head's job server", head)
        print(f"\nhead up in {time.time() - t_head:.1f}s")
        # without the token the job API refuses
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{api}/api/jobs/", timeout=5)
        assert e.value.code == 401
        t0 = time.time()
        # the job server answers before its agent can take jobs: seconds, and on a loaded 2-core machine
        # (the other pytest process busy) over 30 s were seen
        deadline, attempt = time.time() + 90, 0
        while True:
            attempt += 1
            r = subprocess.run([str(ray_bin), "job", "submit", "--address", api, "--working-dir", str(ROOT), "--",
                                "python", "-m", "pipeline", "run", str(yaml), "--output", str(tmp_path)],
                               env=env, capture_output=True, text=True, timeout=600)
            said = r.stdout + r.stderr
            # not ready: no agent yet, or the dashboard dropping the submission's connection (seen under load). A
            # dropped submission may still have started a job: a second one then waits on the store's leases and agrees
            not_ready = ("No available agent to submit job" in said
                         or ("RemoteDisconnected" in said and "submitted successfully" not in said))
            if not not_ready or time.time() > deadline:
                break
            print(f"job server not ready yet (attempt {attempt}): retrying in 2 s")
            time.sleep(2)
        took = time.time() - t0
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        out = r.stdout + r.stderr
        assert "succeeded" in out
        # the job's log is plain progress lines, a line per stage, and ends with the run's summary
        assert "[ingest] done: " in out and " shards (" in out and "\x1b[" not in out.split("[ingest] done")[1][:200]
        assert "[ingest-web]" not in out  # no step lines
        assert f"run directory: {tmp_path / 'remote'}" in out
        _assert_same_as_clean(tmp_path / "remote", small_run)
        print(f"\nray job submit (token auth, working dir uploaded): {took:.1f}s end to end; mixture identical to the local run")
    finally:
        t1 = time.time()
        os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops the head's processes on SIGTERM
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        left = _reap(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"head stopped in {time.time() - t1:.1f}s")
    assert not left, f"the head left processes behind: {left}"


# ---------------------------------------------------------------- a cluster of three nodes


@pytest.fixture(scope="module")
def cluster():
    """Three Ray nodes on this machine (head + 2 workers, one CPU each), real processes."""
    tmp = _short_tmp("crc-")
    c = local_cluster(tmp, num_cpus=1)
    for _ in range(2):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()
    left = _reap(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    assert not left, f"Ray processes left behind: {left}"


def test_a_three_node_cluster_gives_the_bytes_of_a_single_node_run(cluster, demo_corpus, small_run, tmp_path):
    t0 = time.time()
    yaml = write_yaml(tmp_path / "r.yaml", small_mixture(str(demo_corpus), "out"))
    r = curate("run", str(yaml), "--output", str(tmp_path), env={"RAY_ADDRESS": cluster.address}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "remote"
    _assert_same_as_clean(run_dir, small_run)
    nodes = {atomic.read_json(p)["node"] for p in (run_dir / "steps").glob("*/_markers/*.json")}
    print(f"\n3-node cluster run: {time.time() - t0:.1f}s; shards ran on {len(nodes)} nodes; mixture identical to the single-node run")
    assert len(nodes) == 3
    assert atomic.read_json(run_dir / "run.json")["ray_address"] == cluster.address


def test_removing_a_node_in_the_middle_of_a_step_loses_nothing(cluster, demo_corpus, small_run, tmp_path):
    doomed = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    raylet = doomed.all_processes["raylet"][0].process.pid
    run_dir = tmp_path / "remote"
    log = tmp_path / "run"
    yaml = write_yaml(tmp_path / "r.yaml", small_mixture(str(demo_corpus), "out"))
    t0 = time.time()
    proc = _start(["run", str(yaml), "--output", str(tmp_path)], log, env={"RAY_ADDRESS": cluster.address})

    def busy_node() -> list[int]:  # shards running on the doomed node, in whatever step
        # (the small mixture's run takes ~10 s: any step will do, not one in particular)
        procs = _procs()
        return [p for p, (_, cmd) in procs.items() if cmd.startswith("ray::run_shard") and _descends(p, raylet, procs)]

    def writing() -> tuple[str, int] | None:  # a shard the extra node is writing: (step folder, shard)
        for pid in busy_node():
            try:
                targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            except OSError:
                continue
            for t in targets:
                m = re.search(r"/steps/([^/]+)/(?:[^/]+/)*part-(\d{5})[^/]*\.tmp-", t)
                if m:
                    return m.group(1), int(m.group(2))
        return None

    seen: list[tuple[str, int]] = []

    def caught_one() -> bool:  # keep what was seen: the shard may end before a second look
        w = writing()
        if w is not None:
            seen.append(w)
        return w is not None

    _wait_for(caught_one, 300, "a shard being written on the extra node", proc)
    folder, shard = seen[-1]
    running = busy_node()
    procs = _procs()
    on_node = [q for q in procs if _descends(q, raylet, procs)]  # every process of the node, the raylet too
    steps = sorted(p.parent.name for p in (run_dir / "steps").glob("*/step.json") if not (p.parent / "_SUCCESS").exists())
    cluster.remove_node(doomed, allow_graceful=False)
    # A machine that goes away takes every process with it; remove_node kills the node's
    # services and its workers exit when they notice, so a worker could still commit a shard
    # after remove_node returns. Kill what is left, as the machine's loss would, and wait until
    # none of them can write (a zombie cannot: the container's init may never reap it).
    for q in on_node:
        with contextlib.suppress(OSError):
            os.kill(q, signal.SIGKILL)
    _wait_for(lambda: all(_gone(q) for q in on_node), 60, "the removed node's processes to end")
    marker_path = run_dir / "steps" / folder / "_markers" / f"part-{shard:05d}.json"
    ended_before = marker_path.exists()  # the shard may have ended between the look and the node's end
    print(f"\nremoved node {doomed.node_id[:8]} at {time.time() - t0:.1f}s while it ran {len(running)} shard(s) "
          f"(worker pids {running}), writing {(folder, shard)} (ended before: {ended_before}); "
          f"unfinished steps then: {', '.join(steps)}")
    _finish(proc, log)
    _assert_same_as_clean(run_dir, small_run)
    nodes = {atomic.read_json(p)["node"].split("/")[1] for p in (run_dir / "steps").glob("*/_markers/*.json")}
    print(f"run finished at {time.time() - t0:.1f}s; mixture identical to the clean run; shards recorded on {len(nodes)} nodes")
    # the shard the removed node was writing, unfinished when its processes ended, was finished by a
    # node that is still there. (Had it ended before, its record is the removed node's, or a survivor's
    # when the driver never heard of the result and ran it again: both are whole.)
    marker = atomic.read_json(marker_path)
    if not ended_before:
        assert marker["node"].split("/")[1] != doomed.node_id[:8], (marker["node"], doomed.node_id)
    assert "out_files" in marker and "cpu_seconds" in marker, marker  # a whole record, as run_shard writes it


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def test_a_relative_path_that_is_missing_inside_a_job_says_why(tmp_path):
    """Inside `ray job submit`, the YAML sits in Ray's copy of the working directory
    (.../runtime_resources/working_dir_files/_ray_pkg_*/), without git-ignored data."""
    job_dir = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123" / "mixtures"
    job_dir.mkdir(parents=True)
    y = write_yaml(job_dir / "m.yaml", """
        name: m
        sources:
          web: {paths: ["../data/demo/web/*.jsonl.zst"]}
    """)
    r = curate("validate", str(y))
    assert r.returncode == 2
    assert "'../data/demo/web/*.jsonl.zst' matches no file" in r.stderr
    assert "inside a Ray job" in r.stderr and "absolute path on a shared filesystem or a URL" in r.stderr
