"""Shared fixtures: the real demo corpus (built once), a real local Ray, YAML helpers.

`make test` runs the suite in two pytest processes (pytest-xdist, a file at a time): a
session fixture is built once in each process that needs it, so no two processes ever
write into one run directory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = Path(os.environ.get("CURATE_WHEEL_DIR") or ROOT / ".cache" / "wheels")
# what Curate derives once per machine (spaCy's rules, model labels) goes to a folder of
# this session, not the user's ~/.cache/curate (commands started by the tests inherit it)
os.environ.setdefault("CURATE_CACHE_DIR", __import__("tempfile").mkdtemp(prefix="curate-cache-"))
# every step on Ray, as at scale: small steps would otherwise run in curate's own process
# (CURATE_INLINE_DOCS, engine/executor.py), and small runs in local worker processes
# (CURATE_LOCAL_BYTES, engine/pool.py: off with this too); tests/pipeline/engine/test_inline.py runs both
os.environ["CURATE_INLINE_DOCS"] = "0"
# one BLAS thread a test process (set before numpy loads): two pytest processes on 2 cores,
# each with a BLAS pool per core, spend a third of the tune tests' CPU spinning (49.8 s
# against 31.6 s of CPU for test_fit's optimum cases); Curate's own tasks pin theirs the same way
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# Markers (pyproject.toml): `ray` for a test that uses a Ray of the session (its fixtures
# name one), `e2e` for a test that runs the pipeline (`curate run`, runner.run): both are
# set here from what the test uses, so `make test-fast` (-m "not ray and not e2e") runs the
# rest without Ray. There, a test that would start a Ray anyway fails at once naming the
# marker it lacks (CURATE_FORBID_RAY, pipeline/engine/cluster.py), so no mark goes missing.
RAY_FIXTURES = {"ray_local", "joined", "joined_1cpu"}
_RUNS = __import__("re").compile(r'curate\(\s*"(run|sweep)"|runner\.run\(|"--run"|graph\.run\(|\.run_job\(')


def pytest_collection_modifyitems(config, items):
    import inspect

    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & RAY_FIXTURES:
            item.add_marker(pytest.mark.ray)
        try:
            src = inspect.getsource(item.function)
        except (OSError, TypeError):
            src = ""
        if _RUNS.search(src) or any(_RUNS.search(_fixture_source(item, n)) for n in names - RAY_FIXTURES):
            item.add_marker(pytest.mark.e2e)
    if "not ray" in (config.getoption("markexpr") or ""):
        os.environ["CURATE_FORBID_RAY"] = "1"
    # the longest files first (tests/file_times.py), each file's tests in their order: with
    # `--no-loadscope-reorder` (the Makefile) the two processes take files in this order
    from tests.file_times import load

    took = load()
    order = {id(it): i for i, it in enumerate(items)}
    items.sort(key=lambda it: (-took.get(it.nodeid.split("::")[0], 5.0), order[id(it)]))


def _fixture_source(item, name: str) -> str:
    defs = item._fixtureinfo.name2fixturedefs.get(name) or ()
    try:
        return "".join(inspect_source(d.func) for d in defs)
    except (OSError, TypeError):
        return ""


def inspect_source(fn) -> str:
    import inspect

    return inspect.getsource(fn) if not getattr(fn, "__module__", "").startswith("_pytest") else ""


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory) -> Path:
    """The demo corpus with a smaller crawl: wiki (Parquet), web (JSONL.zst), code (JSONL.gz)."""
    from pipeline import demo_data

    out = tmp_path_factory.mktemp("demo")
    demo_data.build(out, wheel_dir=str(WHEEL_DIR), web_pages=3000)
    return out


@pytest.fixture(scope="session")
def wiki_texts(demo_corpus) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(demo_corpus / "wiki" / "summaries_en.parquet", columns=["text"]).column("text").to_pylist()


def local_cluster(tmp, **head_node_args):
    """A ray.cluster_utils head node whose files live under `tmp`. The Cluster also writes
    the latest head's address to Ray's default temp root (/tmp/ray/ray_current_cluster) and
    fails there on a machine where no Ray ever ran (no /tmp/ray): that folder is made first."""
    import tempfile

    from ray.cluster_utils import Cluster

    Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir(), "ray").mkdir(exist_ok=True)
    return Cluster(initialize_head=True, head_node_args={"temp_dir": str(tmp), "include_dashboard": False, **head_node_args})


@pytest.fixture(scope="session")
def ray_local():
    """One real local Ray for the in-process runs of a test session (and the `curate` runs
    that join it: `joined`). Its dashboard agent listens on a port of its own, not Ray's
    default 52365: beside a Ray holding that port, every embedded Ray a `curate run` starts
    retries it for 3.4 s before it gives up on it (its dashboard_agent.log), and this Ray
    lives as long as the session. ray.init has no argument for that port; a head node
    started through ray.cluster_utils takes it."""
    import shutil
    import tempfile

    import ray

    tmp = tempfile.mkdtemp(prefix="r2-", dir="/tmp")  # Ray's socket paths must stay short
    c = local_cluster(tmp, num_cpus=2, dashboard_agent_listen_port=0)
    ray.init(address=c.address, logging_level="ERROR", runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    ray.shutdown()
    c.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def joined(ray_local) -> dict:
    """The environment for a `curate` command that joins the session's Ray instead of starting
    an embedded Ray of its own (the CLI joins RAY_ADDRESS when it is set: engine/cluster.py).
    That saves ~5 s a run (starting and stopping a Ray) and leaves the command as it was: its
    arguments, exit status, output and files. The session's Ray has 2 CPUs, so it is for runs
    with 2 workers (1 worker: `joined_1cpu`) whose point is not the embedded Ray, a fault, or
    an environment of their own (their workers would not see it): those start their own Ray."""
    return {"RAY_ADDRESS": ray_local.get_runtime_context().gcs_address}


@pytest.fixture(scope="session")
def joined_1cpu() -> dict:
    """As `joined`, for runs with 1 worker: a second Ray of the session with 1 CPU (one task
    at a time, as an embedded Ray of `--workers 1`), its dashboard agent on a port of its own
    (see ray_local)."""
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="r1-", dir="/tmp")  # Ray's socket paths must stay short
    c = local_cluster(tmp, num_cpus=1, dashboard_agent_listen_port=0)
    yield {"RAY_ADDRESS": c.address}
    c.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def demo_mixture(demo_corpus: Path) -> str:
    """mixtures/demo.yaml as shipped, pointed at the test corpus. That corpus has a quarter
    of the crawl, so a smaller token target keeps web within max_epochs, and the classifier
    trains on at most 4,000 examples a class (its 3,000 pages are the negatives; 20,000
    Wikipedia positives made training the longest task of every demo run in the suite)."""
    text = (ROOT / "mixtures" / "demo.yaml").read_text().replace("../data/demo", str(demo_corpus))
    assert "max_examples_per_class: 20000" in text, "mixtures/demo.yaml's classifier changed: update this fixture"
    text = text.replace("max_examples_per_class: 20000", "max_examples_per_class: 4000")
    return text.replace("target_tokens: 2000000", "target_tokens: 400000")


PLANTED = [
    "<script>window.__pwned = 1</script> A page that tries to run a script when shown.",
    '<img src=x onerror="window.__pwned = 2"> An image whose error handler would set a global.',
    "</textarea></pre><script>alert('boom')</script> Text that tries to close its container.",
    '<a href="https://example.com/track.gif">link</a><link rel=stylesheet href="https://example.com/x.css">',
]


@pytest.fixture(scope="session")
def demo_run_yaml(demo_corpus, tmp_path_factory) -> Path:
    """The demo mixture on the test corpus, with smaller mixture shards and a `planted`
    source of hostile pages (script tags, onerror handlers) for the page tests."""
    import json

    d = tmp_path_factory.mktemp("demo_run")
    with open(d / "planted.jsonl", "w") as f:
        for i, t in enumerate(PLANTED):
            f.write(json.dumps({"id": f"planted{i}", "text": t}) + "\n")
    text = demo_mixture(demo_corpus).replace("shard_tokens: 500000", "shard_tokens: 100000").replace("\nfilters:", f"""
  planted:
    paths: ["{d}/planted.jsonl"]
    id_field: id

filters:""", 1)
    assert "dir: ../out/_published/{name}" in text, "mixtures/demo.yaml's publish dir changed: update this fixture"
    text = text.replace("dir: ../out/_published/{name}", f"dir: {d}/published/{{name}}")  # the YAML's publish section, kept in here
    return write_yaml(d / "demo.yaml", text)


@pytest.fixture(scope="session")
def demo_run(demo_run_yaml, joined) -> Path:
    """One real run of that mixture with 2 workers, shared by the tests that only read it (on
    the session's Ray: its point is the run directory, not an embedded Ray's start)."""
    out = demo_run_yaml.parent / "w2"
    r = curate("run", str(demo_run_yaml), "--workers", "2", "--output", str(out), env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "demo"


def small_mixture(inputs: str, output: str) -> str:
    """A small mixture of the demo corpus (Spanish summaries, two crawl files, one filter,
    exact dedup): `inputs` the corpus folder or URL, `output` the output folder or URL."""
    return f"""
        name: remote
        output: {output}
        tokenizer: gpt2
        sources:
          wiki: {{paths: ["{inputs}/wiki/summaries_es.parquet"], id_field: id, max_shard_rows: 2500}}
          web: {{paths: ["{inputs}/web/crawl-0000[01].jsonl.zst"], filters: [rep]}}
        filters:
          rep: {{type: gopher_repetition}}
        dedup: {{exact: {{}}}}
        mixture: {{target_tokens: 150000, weights: {{web: 0.5, wiki: 0.5}}, shard_tokens: 50000}}
    """


@pytest.fixture(scope="session")
def small_run(demo_corpus, tmp_path_factory, joined) -> Path:
    """One real local run of `small_mixture` with 2 workers: the bytes that the same mixture
    must give elsewhere (on S3, through `ray job submit`, on a cluster of three nodes)."""
    d = tmp_path_factory.mktemp("small_run")
    y = write_yaml(d / "r.yaml", small_mixture(str(demo_corpus), "out"))
    r = curate("run", str(y), "--workers", "2", env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    return d / "out" / "remote"


def mixture_shas(run_dir) -> dict[str, str]:
    """Each mixture file's sha256 as the run's manifest.json records it (run_dir: a path or URL)."""
    from pipeline.io import atomic, fs

    return {f["path"]: f["sha256"] for f in atomic.read_json(fs.path(run_dir) / "manifest.json")["files"]}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_jsonl(path: Path, rows) -> Path:
    """One JSON object a line."""
    import json

    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def curate(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 300,
           prefix: list[str] = ()) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess (its own embedded Ray, unless `env` names a RAY_ADDRESS);
    `prefix` wraps the command (e.g. setpriv)."""
    e = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    e.update(env or {})
    return subprocess.run([*prefix, sys.executable, "-m", "pipeline", *args], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 API on loopback: moto's server (no network beyond 127.0.0.1)."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"moto server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import s3fs

    s3 = s3fs.S3FileSystem(skip_instance_cache=True)
    s3.mkdir("curate-test")
    yield env, s3, log
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    proc.kill()
    proc.wait()
