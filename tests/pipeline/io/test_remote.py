"""Remote storage: inputs and run directories as fsspec URLs, through one filesystem layer.

The layer's helpers run on fsspec's `memory://`; a whole run reads its inputs from and
writes its run directory to a real S3 API (moto's server on loopback, s3fs as the client)
and must give the bytes of a local run."""

from __future__ import annotations

import os
import re
import time

import pyarrow as pa
import pytest

from pipeline.io import atomic, fs
from tests.conftest import curate, mixture_shas, small_mixture, write_yaml


def test_the_filesystem_layer_commits_atomically_on_memory_urls():
    root = fs.path("memory://curate-test/run")
    atomic.write_json(root / "steps" / "a" / "_markers" / "part-00000.json", {"rows": 3})
    assert atomic.read_json(root / "steps" / "a" / "_markers" / "part-00000.json") == {"rows": 3}
    t = pa.table({"id": ["a", "b", "c"], "n": [1, 2, 3]})
    atomic.write_table(t, root / "steps" / "a" / "part-00000.parquet", compression="zstd")
    assert fs.read_table(root / "steps" / "a" / "part-00000.parquet").equals(t)
    assert fs.parquet_file(root / "steps" / "a" / "part-00000.parquet").metadata.num_rows == 3
    with atomic.parquet_writer(root / "w.parquet", t.schema) as w:
        w.write_table(t)
    assert fs.read_table(root / "w.parquet", columns=["n"]).column("n").to_pylist() == [1, 2, 3]
    # a killed writer leaves only a temporary name, which clean_tmp removes
    (root / "steps" / "a" / "part-00001.parquet.tmp-dead0001").write_bytes(b"half")
    assert atomic.clean_tmp(root / "steps") == 1
    names = sorted(p.name for p in (root / "steps" / "a").iterdir())
    assert names == ["_markers", "part-00000.parquet"]
    # a directory put in place of another, as the mixture/ and samples/ links are
    atomic.write_bytes(root / "pub.tmp" / "x" / "1.txt", b"new")
    atomic.write_bytes(root / "pub" / "old.txt", b"old")
    fs.replace_dir(root / "pub.tmp", root / "pub")
    assert [p.name for p in (root / "pub").rglob("*.txt")] == ["1.txt"]
    assert not (root / "pub.tmp").exists()
    with fs.local_file(root / "pub" / "x" / "1.txt") as local:  # how fastText reads a remote model
        assert local.read_bytes() == b"new"
        fs.copy(local, root / "model.bin")  # and how a trained one is written
    assert (root / "model.bin").read_bytes() == b"new"
    assert atomic.file_digest(root / "pub" / "x" / "1.txt")[0] == 3


class FaultyProxy:
    """An HTTP proxy in front of moto's S3 that answers a share of requests with a 500
    InternalError, as an object store under load does (seeded: the same requests fail)."""

    def __init__(self, target_port: int, rate: float, seed: int = 7):
        import http.client
        import random
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        proxy = self
        self.rate, self.rng, self.lock = rate, random.Random(seed), threading.Lock()
        self.requests = self.faults = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy.lock:
                    proxy.requests += 1
                    fail = proxy.rng.random() < proxy.rate
                    proxy.faults += fail
                if fail:
                    out = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
                           b"<Message>We encountered an internal error. Please try again.</Message></Error>")
                    self.send_response(500)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(out)
                    return
                c = http.client.HTTPConnection("127.0.0.1", target_port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("expect", "connection")}
                c.request(self.command, self.path, body=body or None, headers=headers)
                r = c.getresponse()
                data = r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # a HEAD's length is the object's, not that of the (empty) body
                self.send_header("Content-Length", r.getheader("Content-Length", "0") if self.command == "HEAD"
                                 else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                c.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


# the local runs the S3 runs are compared with, as `curate run` runs a mixture this small by
# default: without Ray (engine/pool.py); the S3 runs are on Ray
SMALL_RUN = {"CURATE_INLINE_DOCS": "5000"}


def test_a_run_on_s3_gives_the_bytes_of_a_local_run(s3_server, demo_corpus, small_run, tmp_path):
    """... with 1% of its store requests failing (500 InternalError): the client's retries,
    then the shard's, then Ray's."""
    env, s3, log = s3_server
    for sub in ("wiki/summaries_es.parquet", "web/crawl-00000.jsonl.zst", "web/crawl-00001.jsonl.zst"):
        s3.put(str(demo_corpus / sub), f"curate-test/in/{sub}")
    y = write_yaml(tmp_path / "r.yaml", small_mixture("s3://curate-test/in", "s3://curate-test/runs"))
    proxy = FaultyProxy(int(env["AWS_ENDPOINT_URL"].rsplit(":", 1)[1]), rate=0.01)
    mark = len(log.read_text(errors="replace").splitlines())
    t0 = time.time()
    try:
        r = curate("run", str(y), "--workers", "2", env={**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"})
    finally:
        proxy.close()
    took = time.time() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    assert proxy.faults >= 5, (proxy.requests, proxy.faults)
    print(f"\n{proxy.faults} of {proxy.requests} store requests failed (500 InternalError); the run finished")
    run = "s3://curate-test/runs/remote"
    assert f"run directory: {run}" in r.stdout
    remote, local = mixture_shas(run), mixture_shas(small_run)
    print(f"\nS3 run (moto on loopback): {took:.1f}s; {len(remote)} mixture files, same sha256 as the local run: {remote == local}")
    assert remote == local and len(remote) >= 3
    # the files themselves, not only the manifest's word for them
    import hashlib

    for p, sha in remote.items():
        assert hashlib.sha256(s3.cat(f"curate-test/runs/remote/{p}")).hexdigest() == sha
    led_r, led_l = (atomic.read_json(fs.path(x) / "ledger.json")["sources"] for x in (run, small_run))
    assert led_r == led_l and all(v["conservation"] is True for v in led_r.values())
    # every output went straight to its final key: no temporary object was written, copied or deleted
    temporaries = [ln for ln in log.read_text(errors="replace").splitlines()[mark:] if ".tmp-" in ln]
    assert not temporaries, temporaries[:5]
    # publication copies on the server: once the mix step is done, no GET of its shards reaches the store
    # (a GET would be the driver streaming the bytes); the log colours some lines with ANSI codes
    lines = log.read_text(errors="replace").splitlines()
    done = max(i for i, x in enumerate(lines) if re.search(r'PUT /curate-test/runs/_store/steps/mix-[0-9a-f]+/_SUCCESS', x))
    mix_gets = [x for x in lines[done:] if re.search(r'GET /curate-test/runs/_store/steps/mix-[0-9a-f]+/part-', x)]
    assert mix_gets == [], mix_gets[:3]
    assert any(re.search(r'PUT /curate-test/runs/remote/mixture/part-', x) for x in lines[done:])
    keys = s3.find("curate-test/runs")
    assert not [k for k in keys if ".tmp-" in k or k.endswith(".tmp")], "temporary objects left behind"
    assert any(k.endswith("/_SUCCESS") for k in keys) and any("/samples/index.html" in k for k in keys)
    # inputs are named by URL in provenance; a rerun resumes from the object store: nothing runs again
    r2 = curate("run", str(y), "--workers", "2", env=env)
    assert r2.returncode == 0, r2.stderr[-2000:]
    rec = atomic.read_json(fs.path(run) / "run.json")
    assert {s["status"] for s in rec["steps"].values()} == {"SKIPPED"}
    # an edit of web's filter on S3: wiki's shards are reused by content (server-side copies into the
    # new step folders, keyed by the objects' ETags: engine/reuse.py), and the bytes are a fresh local run's
    old, new = "rep: {type: gopher_repetition}", "rep: {type: gopher_repetition, max_dup_line_frac: 0.25}"
    text = small_mixture("s3://curate-test/in", "s3://curate-test/runs").replace(old, new).replace("name: remote", "name: edited")
    mark = len(log.read_text(errors="replace").splitlines())
    r3 = curate("run", str(write_yaml(tmp_path / "e.yaml", text)), "--workers", "2", env=env)
    assert r3.returncode == 0, r3.stderr[-2000:]
    assert _reused_without_copies(log, mark, "s3://curate-test/runs/edited") >= 4
    local = curate("run", str(write_yaml(tmp_path / "l.yaml", small_mixture(str(demo_corpus), str(tmp_path / "local"))
                                         .replace(old, new).replace("name: remote", "name: edited"))), "--workers", "2", env=SMALL_RUN)
    assert local.returncode == 0, local.stderr[-2000:]
    assert mixture_shas("s3://curate-test/runs/edited") == mixture_shas(tmp_path / "local" / "edited")
    steps = atomic.read_json(fs.path("s3://curate-test/runs/edited") / "run.json")["steps"]
    assert steps["filter-web"]["computed"] == steps["filter-web"]["shards"]
    wiki = steps["ingest-wiki"]["shards"]
    assert steps["dedup-exact-map"]["reused"] >= wiki, steps["dedup-exact-map"]
    # a new input file, and Levanter caches (through 1% of failing requests again): the shards of the
    # others are reused without a copy, and the bytes are a local run's, the caches' included
    s3.put(str(demo_corpus / "web/crawl-00002.jsonl.zst"), "curate-test/in/web/crawl-00002.jsonl.zst")
    tz = "\n        tokenize: {formats: [levanter]}\n"
    grown = text.replace("crawl-0000[01]", "crawl-0000[012]") + tz
    assert "crawl-0000[012]" in grown
    mark = len(log.read_text(errors="replace").splitlines())
    proxy = FaultyProxy(int(env["AWS_ENDPOINT_URL"].rsplit(":", 1)[1]), rate=0.01)
    try:  # the file edited in place
        r4 = curate("run", str(write_yaml(tmp_path / "e.yaml", grown)), "--workers", "2",
                    env={**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"})
    finally:
        proxy.close()
    assert r4.returncode == 0 and proxy.faults >= 3, (proxy.faults, r4.stderr[-2000:])
    assert _reused_without_copies(log, mark, "s3://curate-test/runs/edited") >= 10
    steps = atomic.read_json(fs.path("s3://curate-test/runs/edited") / "run.json")["steps"]
    assert steps["ingest-web"]["reused"] == 2 and steps["ingest-web"]["computed"] == 1, steps["ingest-web"]
    local = curate("run", str(write_yaml(tmp_path / "lg.yaml", small_mixture(str(demo_corpus), str(tmp_path / "local2"))
                                         .replace(old, new).replace("name: remote", "name: edited")
                                         .replace("crawl-0000[01]", "crawl-0000[012]") + tz)), "--workers", "2", env=SMALL_RUN)
    assert local.returncode == 0, local.stderr[-2000:]
    assert mixture_shas("s3://curate-test/runs/edited") == mixture_shas(tmp_path / "local2" / "edited")
    _levanter_caches_are_the_local_ones(s3, tmp_path / "local2" / "edited", "curate-test/runs/edited/tokenized/levanter/")


def _levanter_caches_are_the_local_ones(s3, local_run, prefix: str) -> None:
    """The Levanter caches of a run on S3 against a local run's: every cache file the same bytes
    (the chunk files are committed through the file layer, which retries; tensorstore only
    encodes); layout mixture: the cache is the mixture files' documents in their order, each
    decoding to its text."""
    import pyarrow.parquet as pq
    import yaml

    from bench.levanter_reader import Cache
    from pipeline.plan import tokens

    root_l = local_run / "tokenized" / "levanter"
    got_l = {str(p.relative_to(root_l)): p.read_bytes() for p in root_l.rglob("*") if p.is_file()}
    got_r = {k[len(prefix):]: s3.cat(k) for k in s3.find(prefix)}
    assert set(got_r) == set(got_l) and "mixture/train/input_ids/data/c/0" in got_l
    assert [k for k in got_l if got_l[k] != got_r[k]] == ["levanter-data.yaml"]  # it names its own root
    cfg = yaml.safe_load(got_r["levanter-data.yaml"])
    assert cfg["configs"]["mixture"]["cache_dir"] == "s3://" + prefix + "mixture"
    c = Cache(str(root_l / "mixture" / "train"))
    m = atomic.read_json(local_run / "manifest.json")
    assert c.num_rows == sum(f["rows"] for f in m["files"]) and c.data_size == m["tokenized"]["formats"]["levanter"]["tokens"]
    enc = tokens.load("gpt2")
    texts = [t for p in sorted((local_run / "mixture").glob("part-*.parquet"))
             for t in pq.read_table(p, columns=["text"]).column("text").to_pylist()]
    assert len(texts) == c.num_rows
    for i, row in c.rows():
        assert enc.decode(row[:-1].tolist()) == texts[i], i
    r = curate("verify-tokens", str(local_run))
    assert r.returncode == 0 and "levanter: 1 caches" in r.stdout, r.stdout + r.stderr


def _reused_without_copies(log, mark: int, run: str) -> int:
    """The shards a run on S3 reused: each is its marker's references to the earlier objects
    (fs.link_all), and no request since `mark` wrote its data (a PUT, or a server-side copy,
    which is a PUT of the new key). Returns their count."""
    from pipeline.engine.step import read_markers

    puts = "\n".join(x for x in log.read_text(errors="replace").splitlines()[mark:] if "PUT /curate-test/" in x)
    store = fs.path(run).parent / "_store" / "steps"
    reused = 0
    for rec in atomic.read_json(fs.path(run) / "run.json")["steps"].values():
        if not rec.get("reused"):
            continue
        folder = rec["dir"].rsplit("/", 1)[-1]
        for m in read_markers(store / folder).values():
            if "reused_from" in m:
                reused += 1
                assert set(m["refs"]) == set(m["out_files"]), m
                for rel in m["out_files"]:
                    assert f"/curate-test/runs/_store/steps/{folder}/{rel} " not in puts, (folder, rel)
    return reused


def _s3_race(url):
    from pipeline.engine.lease import Leases

    return Leases(name=f"racer-{os.getpid()}").acquire(url) is None


def test_leases_on_s3_are_conditional_writes_so_one_run_takes_over(s3_server):
    import multiprocessing as mp

    import orjson

    from pipeline.engine.lease import Leases, holder

    env, s3, _ = s3_server
    url = "s3://curate-test/_store/_leases/step-abc"
    a, b = Leases(name="a"), Leases(name="b")
    assert a.acquire(url) is None and b.acquire(url)["run"] == a.run_id
    a.release(url)
    assert holder(url) is None and b.acquire(url) is None
    b.release_all()
    # an expired lease of a run on another machine: of 8 processes taking it over, one wins
    s3.pipe_file("curate-test/_store/_leases/step-race/gen-000001.json", orjson.dumps(
        {"run": "gone", "name": "gone", "host": "elsewhere", "pid": 1, "renewed": time.time() - 600, "ttl": 60}))
    with mp.get_context("spawn").Pool(8) as pool:
        won = pool.map(_s3_race, ["s3://curate-test/_store/_leases/step-race"] * 8)
    assert sum(won) == 1, won
    assert sorted(p.rsplit("/", 1)[-1] for p in s3.ls("curate-test/_store/_leases/step-race", refresh=True)) == \
        ["gen-000001.json", "gen-000002.json"]


def test_a_file_written_to_s3_goes_to_its_final_key_whole_or_not_at_all(s3_server):
    """On S3 a file is written straight to its final key (one PUT: no temporary object, no
    copy, no delete), and a write that fails midway commits nothing: no object at the final
    name, no temporary left; a shuffle file and a Parquet file the same."""
    import numpy as np

    from pipeline.shards import shuffle

    env, s3, log = s3_server
    d = fs.path("s3://curate-test/creating")
    mark = len(log.read_text(errors="replace").splitlines())
    with fs.recording() as got:
        atomic.write_bytes(d / "a.bin", b"x" * 1000)
    assert s3.cat_file("curate-test/creating/a.bin") == b"x" * 1000
    assert got[0][0] == str(d / "a.bin") and got[0][1].startswith("etag:")  # its digest, from one HEAD
    asked = [ln for ln in log.read_text(errors="replace").splitlines()[mark:] if "/curate-test/creating/" in ln]
    assert not any(".tmp-" in ln for ln in asked), asked
    assert sum(1 for ln in asked if '"PUT ' in ln) == 1 and not any('"DELETE ' in ln for ln in asked), asked

    with pytest.raises(RuntimeError, match="stop"):
        with atomic.creating(d / "b.bin") as f:
            f.write(b"y" * 1000)
            raise RuntimeError("stop")
    with pytest.raises(RuntimeError, match="bad row"):
        atomic.write_stream(d / "c.bin", (b"z" * 100 if i < 3 else (_ for _ in ()).throw(RuntimeError("bad row"))
                                          for i in range(5)))
    shuffle.write_partitions(pa.table({"k": np.arange(10)}), np.arange(10) % 3, 3, shuffle.map_file(d / "sh", 0))
    atomic.write_table(pa.table({"a": [1, 2]}), d / "t.parquet")
    assert fs.read_table(d / "t.parquet").column("a").to_pylist() == [1, 2]
    assert shuffle.read_partition(d / "sh", 1, 1).column("k").to_pylist() == [1, 4, 7]
    assert sorted(p.rsplit("/", 1)[-1] for p in s3.find("curate-test/creating")) == \
        ["a.bin", "part-00000.data", "part-00000.index", "t.parquet"]


def test_reading_a_parquet_file_on_s3_asks_no_size_first(s3_server):
    """s3fs asks an object's size (a HEAD) before a whole-object GET; a read here is one
    ranged GET instead: a shard file, a JSON file, a Parquet footer for a schema (its last
    64 KB, not the object)."""
    env, s3, log = s3_server
    d = fs.path("s3://curate-test/reads")
    t = pa.table({"a": list(range(1000)), "b": [f"row {i}" for i in range(1000)]})
    atomic.write_table(t, d / "t.parquet")
    atomic.write_json(d / "m.json", {"x": 1})

    def asked(fn):
        mark = len(log.read_text(errors="replace").splitlines())
        got = fn()
        lines = [ln for ln in log.read_text(errors="replace").splitlines()[mark:] if "/curate-test/reads/" in ln]
        return got, [m for ln in lines for m in ("GET", "HEAD") if f"{m} /curate-test/reads/" in ln]

    assert asked(lambda: fs.parquet_schema(d / "t.parquet").names) == (["a", "b"], ["GET"])
    assert asked(lambda: fs.parquet_metadata(d / "t.parquet").num_rows) == (1000, ["GET"])
    got, kinds = asked(lambda: fs.read_table(d / "t.parquet", columns=["b"]))
    assert got.column("b").to_pylist() == t.column("b").to_pylist() and kinds == ["GET"]
    got, kinds = asked(lambda: fs.parquet_file(d / "t.parquet").read(columns=["a"]))
    assert got.column("a").to_pylist() == list(range(1000)) and kinds == ["GET"]
    assert asked(lambda: atomic.read_json(d / "m.json")) == ({"x": 1}, ["GET"])
    s3.pipe_file("curate-test/reads/empty", b"")  # an empty object refuses a range: read whole
    assert fs.read_bytes(d / "empty") == b""


def test_a_parquet_file_past_the_whole_object_size_reads_on_from_its_first_range(s3_server, monkeypatch):
    """A file larger than fs.WHOLE_OBJECT: its first bytes come from the first ranged GET and
    the rest from a read-ahead file (one HEAD for its size), which never fetches those first
    bytes again; the rows are the file's."""
    import numpy as np

    env, s3, log = s3_server
    monkeypatch.setattr(fs, "WHOLE_OBJECT", 512 << 10)  # past pyarrow's own 64 KB footer read
    d = fs.path("s3://curate-test/large")
    rng = np.random.default_rng(0)
    t = pa.table({"a": np.arange(200_000), "b": rng.random(200_000)})  # ~3 MB, incompressible floats
    atomic.write_table(t, d / "t.parquet", row_group_size=20_000)
    assert s3.size("curate-test/large/t.parquet") > 5 * fs.WHOLE_OBJECT
    mark = len(log.read_text(errors="replace").splitlines())
    got = fs.parquet_file(d / "t.parquet").read()
    assert got.equals(t)
    lines = [ln for ln in log.read_text(errors="replace").splitlines()[mark:] if "/curate-test/large/" in ln]
    assert sum('HEAD /curate-test/large/' in ln for ln in lines) <= 1, lines  # the size, once, for the footer
    # the read-ahead file fetches only what lies past the first range, and pyarrow's 64 KB footer read
    import pyarrow.parquet as pq

    p = d / "t.parquet"
    raw = fs._Prefixed(fs._cat(p, fs.WHOLE_OBJECT), p)
    assert pq.ParquetFile(pa.PythonFile(raw, mode="r")).read().equals(t)
    size = s3.size("curate-test/large/t.parquet")
    assert 0 < raw._f.cache.total_requested_bytes <= size - fs.WHOLE_OBJECT + (64 << 10), (raw._f.cache.total_requested_bytes, size)


def test_a_large_publication_on_s3_is_copied_by_tasks_not_the_driver(ray_local, s3_server, monkeypatch):
    """Past COPY_GROUP files, a folder published to an object store is copied by tasks (each
    COPY_GROUP files, server-side, 32 at a time) that the publishing process hands them to:
    graph.publish gives fan_out (Ray tasks when Ray is up). Every file lands with its bytes,
    and a file the folder held before and no longer names is deleted."""
    env, s3, _ = s3_server
    monkeypatch.setattr(atomic, "COPY_GROUP", 3)
    srcs = []
    for i in range(8):
        s3.pipe(f"curate-test/pub-src/f{i}.bin", bytes([i]) * (100 + i))
        srcs.append(f"s3://curate-test/pub-src/f{i}.bin")
    s3.pipe("curate-test/pub/dest/stale.bin", b"old")
    remote = ray_local.remote(runtime_env={"env_vars": env})(atomic.copy_group)  # the workers see moto's endpoint

    def mapper(fn, calls):
        assert fn is atomic.copy_group
        return ray_local.get([remote.remote(*c) for c in calls])

    with atomic.copying(mapper):
        pids = atomic.link_tree([(s, f"sub/{i}.bin") for i, s in enumerate(srcs)], fs.path("s3://curate-test/pub/dest"))
    assert len(pids) == 3 and os.getpid() not in pids  # ceil(8 / 3) tasks, none of them this process
    s3.invalidate_cache()
    assert sorted(k.rsplit("/", 1)[1] for k in s3.find("curate-test/pub/dest")) == [f"{i}.bin" for i in range(8)]
    assert all(s3.cat(f"curate-test/pub/dest/sub/{i}.bin") == bytes([i]) * (100 + i) for i in range(8))
    # below COPY_GROUP files, the publishing process copies them itself
    with atomic.copying(mapper):
        assert atomic.link_tree([(srcs[0], "a.bin")], fs.path("s3://curate-test/pub/one")) == [os.getpid()]
