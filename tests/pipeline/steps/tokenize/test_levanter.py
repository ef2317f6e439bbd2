"""Levanter caches (`tokenize.formats: [levanter]`): the demo mixture with `formats:
[megatron, levanter]` and `layout: cells`, read back through bench/levanter_reader.py (a
reader written from Levanter's source, opening the arrays with Levanter's metadata as a
constraint): every document of every cache decodes to its kept text in order with EOS; each
cell's cache holds every available document of the cell once (kept by the filters and the
global layers, whether the mixture chose it or not) and its tokens; train_weights are the
mixture's cell weights; a weights edit rewrites levanter-data.yaml and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from bench.levanter_reader import Cache
from pipeline.io import atomic
from pipeline.plan import tokens
from pipeline.shards import decisions as dec
from pipeline.steps.tokenize import levanter
from tests.conftest import curate, demo_mixture, write_yaml

WEIGHTS = "weights: {web/q5: 0.25, web/q3-q4: 0.35, wiki: 0.3, code: 0.1}"
EDITED = "weights: {web/q5: 0.3, web/q3-q4: 0.3, wiki: 0.3, code: 0.1}"


def _files(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_ino, p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def lev(demo_corpus, tmp_path_factory, joined):
    """The run, the files of tokenized/levanter/ then, and the run again after a weights edit."""
    d = tmp_path_factory.mktemp("levanter")
    text = demo_mixture(demo_corpus).replace("formats: [megatron, memmap]", "formats: [megatron, levanter]\n  layout: cells")
    assert "layout: cells" in text and WEIGHTS in text, "mixtures/demo.yaml changed: update this fixture"
    text = text.replace("dir: ../out/_published/{name}", f"dir: {d}/published/{{name}}")
    y = write_yaml(d / "demo.yaml", text)
    r = curate("run", str(y), "--workers", "2", "--output", str(d / "out"), env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    run = d / "out" / "demo"
    before = _files(run / "tokenized" / "levanter")
    write_yaml(y, text.replace(WEIGHTS, EDITED))
    r = curate("run", str(y), "--workers", "2", "--output", str(d / "out"), env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    return run, before


def _available(run: Path) -> dict[str, list[dict]]:
    """Every available document (kept by filters and layers; chosen by the mixture or not) by
    source, in shard and row order, with its final text and quality bucket."""
    r = dec.Run(run)
    out: dict[str, list[dict]] = {}
    for src in ("wiki", "web", "code"):
        for part in r.shards(src):
            t = dec.shard_decisions(r, src, part, with_text=True)
            for row in t.select(["id", "status", "stage", "text", "scores"]).to_pylist():
                if row["status"] == "kept" or row["stage"] == "mix":
                    b = json.loads(row["scores"] or "{}").get("quality_bucket")
                    out.setdefault(src, []).append({"id": row["id"], "text": row["text"], "bucket": b})
    return out


def _cell(src: str, bucket) -> str:
    if src != "web":
        return src
    return "web__q5" if bucket == 5 else "web__q3-q4" if bucket in (3, 4) else "web__q1-q2"


def test_every_cell_cache_holds_its_available_documents_once_decoding_to_their_texts(lev):
    run, _ = lev
    root = run / "tokenized" / "levanter"
    enc = tokens.load("gpt2")
    eos = tokens.end_of_text("gpt2")[1]
    want: dict[str, list[dict]] = {}
    for src, docs in _available(run).items():
        for d in docs:
            want.setdefault(_cell(src, d["bucket"]), []).append(d)
    assert set(want) == {"wiki", "code", "web__q5", "web__q3-q4", "web__q1-q2"}
    manifest = atomic.read_json(run / "manifest.json")["tokenized"]["formats"]["levanter"]
    for cell, docs in want.items():
        c = Cache(str(root / cell / "train"))
        assert c.data.dtype.name == "int32" and c.ledger["total_num_rows"] == c.num_rows == len(docs), cell
        ids = [i for p in sorted((root / cell / "train" / "provenance").glob("*.docs.parquet"))
               for i in pq.read_table(p, columns=["id"]).column("id").to_pylist()]
        assert ids == [d["id"] for d in docs], cell  # every available document once, in shard and row order
        ends = c.ends()
        assert c.data_size == int(ends[-1])
        for i, row in c.rows():
            assert row[-1] == eos and eos not in row[:-1].tolist(), (cell, i)
            assert enc.decode(row[:-1].tolist()) == docs[i]["text"], (cell, i)
        assert c.data_size == sum(len(enc.encode_ordinary(d["text"])) + 1 for d in docs)  # the cell's available tokens
        assert manifest["caches"][cell]["tokens"] == c.data_size and manifest["caches"][cell]["documents"] == len(docs)
    held = Cache(str(root / "validation" / "validation"))
    assert held.num_rows == manifest["caches"]["validation"]["documents"] > 0


def test_train_weights_are_the_mixtures_cell_weights_and_an_edit_rewrites_only_the_yaml(lev):
    run, before = lev
    root = run / "tokenized" / "levanter"
    cfg = yaml.safe_load((root / "levanter-data.yaml").read_text())
    assert cfg["train_weights"] == {"wiki": 0.3, "web__q1-q2": 0.0, "web__q3-q4": 0.3, "web__q5": 0.3, "code": 0.1,
                                    "validation": 0.0}  # the edited weights
    assert cfg["tokenizer"] == "gpt2" and cfg["cache_dir"] == str(root)
    assert {n: c["cache_dir"] for n, c in cfg["configs"].items()} == {n: str(root / n) for n in cfg["train_weights"]}
    after = _files(root)
    assert set(after) == set(before)
    changed = [f for f in after if after[f] != before[f]]
    assert changed == ["levanter-data.yaml"]  # every cache file the same inode: linked, not rewritten
    rec = atomic.read_json(run / "run.json")["steps"]
    assert all(rec[n]["status"] == "SKIPPED" for n in rec if n.startswith(("tokenize-", "tokens-levanter"))), \
        {n: rec[n]["status"] for n in rec if n.startswith(("tokenize-", "tokens-"))}


def test_arrays_carry_levanters_metadata_and_chunk_tasks_tile_a_large_cache():
    meta = json.loads(levanter.metadata("data"))
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [256 * 1024 * 512] and meta["data_type"] == "int32"
    shard = meta["codecs"][0]
    assert shard["name"] == "sharding_indexed" and shard["configuration"]["chunk_shape"] == [256 * 1024]
    assert [c["name"] for c in shard["configuration"]["codecs"]] == ["bytes", "blosc"]
    assert json.loads(levanter.metadata("offsets"))["data_type"] == "int64"
    # 3 pieces across two data chunks: each chunk lists only the ranges it holds, tiling them
    W = levanter.CHUNK
    pieces = [{"path": f"p{i}", "rows": r, "tokens": t} for i, (r, t) in enumerate([(10, W - 5), (4, 20), (3, W)])]
    specs = levanter.plan_chunks("c", pieces)
    data = [s for s in specs if s["array"] == "data"]
    assert [(s["lo"], s["hi"]) for s in data] == [(0, W), (W, 2 * W), (2 * W, 2 * W + 15)]
    # each input names the file it reads (a shard's key digests the files its spec names)
    assert [(i["path"], i["skip"], i["take"], i["at"]) for i in data[0]["inputs"]] == [("p0.ids", 0, W - 5, 0), ("p1.ids", 0, 5, W - 5)]
    assert [(i["path"], i["skip"], i["take"]) for i in data[1]["inputs"]] == [("p1.ids", 5, 15), ("p2.ids", 0, W - 15)]
    offs = [s for s in specs if s["array"] == "offsets"]
    assert len(offs) == 1 and offs[0]["hi"] == 18 and [(i["path"], i["at"], i["base"]) for i in offs[0]["inputs"]] == \
        [("p0.docs.parquet", 1, 0), ("p1.docs.parquet", 11, W - 5), ("p2.docs.parquet", 15, W + 15)]


def test_chunk_files_are_tensorstores_bytes_whatever_the_pieces(tmp_path):
    """A chunk written from one piece or from many small ones is the same file, and the file
    tensorstore writes for the same array (an inner chunk of zeros left out as it does)."""
    from pipeline.engine.step import ShardOutput

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50257, 3_000_000).astype("<u2")
    ids[levanter.INNER:2 * levanter.INNER] = 0  # an inner chunk of the fill value: not stored
    lens = np.full(3000, 1000)
    outs = []
    for k, cuts in enumerate(([3000], [7, 993, 1000, 1000], [1] * 50 + [2950])):
        pieces, at, r = [], 0, 0
        for j, n in enumerate(cuts):
            base = tmp_path / f"v{k}" / f"p{j}"
            base.parent.mkdir(parents=True, exist_ok=True)
            t = int(lens[r:r + n].sum())
            ids[at:at + t].tofile(str(base) + ".ids")
            ends = np.cumsum(lens[r:r + n])
            pq.write_table(pa.table({"end": ends}), str(base) + ".docs.parquet")
            pieces.append({"path": str(base), "rows": n, "tokens": t})
            at, r = at + t, r + n
        got = {}
        for i, sp in enumerate(levanter.plan_chunks("c", pieces)):
            out = ShardOutput(str(tmp_path / f"o{k}"), i)
            levanter.cache_chunk({**sp, "ids": "uint16"}, out)
        for p in sorted((tmp_path / f"o{k}").rglob("*")):
            if p.is_file():
                got[str(p.relative_to(tmp_path / f"o{k}"))] = p.read_bytes()
        outs.append(got)
    assert outs[0] == outs[1] == outs[2] and "c/input_ids/data/c/0" in outs[0]
    # byte for byte what tensorstore writes for the same arrays (zarr_shard.py streams it instead)
    for array, values in (("data", ids.astype(np.int32)), ("offsets", np.r_[3000, np.cumsum(lens)].astype(np.int64))):
        a = levanter._memory_array(array)
        a[0:len(values)].write(values).result()
        assert outs[0][f"c/input_ids/{array}/c/0"] == a.kvstore.read("c/0").result().value, array
        assert outs[0][f"c/input_ids/{array}/zarr.json"] == a.kvstore.read("zarr.json").result().value


def test_verify_tokens_reads_the_caches_and_catches_planted_faults(lev, tmp_path):
    import shutil

    import tensorstore as ts

    run, _ = lev
    r = curate("verify-tokens", str(run))
    assert r.returncode == 0 and "levanter: 6 caches" in r.stdout, r.stdout + r.stderr
    copy = tmp_path / "demo"
    shutil.copytree(run, copy)  # copies: the run's files are links into the step store
    data = copy / "tokenized" / "levanter" / "wiki" / "train" / "input_ids" / "data"
    a = ts.open(levanter.array_spec({"driver": "file", "path": str(data)}), open=True).result()
    a[3:4].write(np.array([tokens.end_of_text("gpt2")[1]], np.int32)).result()  # an EOS inside the first document
    (copy / "tokenized" / "levanter" / "code" / "train" / "shard_ledger.json").unlink()
    r = curate("verify-tokens", str(copy))
    assert r.returncode != 0
    assert "tokenized/levanter/wiki/train: the special 50256 inside a document, at token 3" in r.stdout + r.stderr
    assert "tokenized/levanter/code/train: cannot be opened" in r.stdout + r.stderr


def test_explain_names_the_document_at_a_cache_token(lev):
    run, _ = lev
    m = atomic.read_json(run / "manifest.json")["tokenized"]["formats"]["levanter"]["caches"]["web__q5"]
    p = m["pieces"][1]
    side = pq.read_table(run / p["provenance"]).to_pylist()
    off = p["start"] + side[2]["start"] + 1  # the third document of the second piece, its second token
    r = curate("explain", str(run), "--token", f"tokenized/levanter/web__q5:{off}")
    assert r.returncode == 0, r.stderr
    doc = m["pieces"][0]["documents"] + 2
    first = r.stdout.splitlines()[0]
    assert f"document {doc} of the file" in first and side[2]["id"] in first, first
    c = Cache(str(run / "tokenized" / "levanter" / "web__q5" / "train"))
    assert int(c.ends()[doc - 1]) == p["start"] + side[2]["start"]  # the cache's offsets put that document there


@pytest.mark.parametrize("tz, key, says", [
    ("{formats: [levanter], pack: {seq_len: 128}}", "tokenize.pack", "Levanter cache holds documents"),
    ("{formats: [levanter], dtype: uint16}", "tokenize.dtype", "int32"),
])
def test_what_a_cache_cannot_hold_is_a_config_error_naming_the_key(tmp_path, demo_corpus, tz, key, says):
    from tests.conftest import small_mixture

    y = write_yaml(tmp_path / "x.yaml", small_mixture(str(demo_corpus), "out") + f"\n        tokenize: {tz}\n")
    r = curate("plan", str(y))
    assert r.returncode != 0 and key in r.stderr and says in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_phases_are_a_config_error_naming_the_key(tmp_path, demo_corpus):
    from tests.conftest import small_mixture

    text = small_mixture(str(demo_corpus), "out").replace(
        "mixture: {target_tokens: 150000, weights: {web: 0.5, wiki: 0.5}, shard_tokens: 50000}",
        "mixture: {shard_tokens: 50000, phases: [{name: a, target_tokens: 50000, weights: {web: 0.5, wiki: 0.5}}, "
        "{name: b, target_tokens: 50000, weights: {web: 0.2, wiki: 0.8}}]}")
    assert "phases" in text
    r = curate("plan", str(write_yaml(tmp_path / "p.yaml", text + "\n        tokenize: {formats: [levanter]}\n")))
    assert r.returncode != 0 and "mixture.phases" in r.stderr and "levanter" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
