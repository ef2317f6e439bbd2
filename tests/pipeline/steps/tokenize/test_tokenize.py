"""Tokenized output against the anchors' own writers: the small mixture of the demo corpus
with `tokenize: {formats: [megatron, datatrove]}`, its token files compared byte for byte
with datatrove 0.10.1's `MegatronDocumentTokenizer` and `DocumentTokenizer` run on the
mixture files' texts in order (GPT-2 from the same offline files, EOS after every document);
every document read back through Megatron's documented layout decodes to its mixture text;
a weights-only edit encodes nothing again."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.config.tokenize import TokenizeSpec
from pipeline.io import atomic
from pipeline.plan import tokens
from pipeline.steps.tokenize import formats
from tests.conftest import curate, small_mixture, write_yaml

TOKENIZE = "\n        tokenize: {formats: [megatron, datatrove, memmap]}\n"


@pytest.fixture(scope="module")
def tok_runs(demo_corpus, tmp_path_factory, joined):
    """The mixture, then a weights-only variant of it on the same store."""
    d = tmp_path_factory.mktemp("tokenize")
    y = write_yaml(d / "t.yaml", _mixture(demo_corpus))
    r = curate("run", str(y), "--workers", "2", env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    v = write_yaml(d / "v.yaml", _mixture(demo_corpus).replace(
        "name: remote", "name: variant").replace("web: 0.5, wiki: 0.5", "web: 0.7, wiki: 0.3"))
    r = curate("run", str(v), "--workers", "2", env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    return d / "out" / "remote", d / "out" / "variant"


def _mixture(demo_corpus) -> str:
    """The small mixture, a validation split held out, every token format."""
    text = small_mixture(str(demo_corpus), "out").replace("shard_tokens: 50000}", "shard_tokens: 50000, validation: {fraction: 0.05}}")
    assert "validation" in text
    return text + TOKENIZE


def _variant(tok_runs, demo_corpus, joined, name: str, option: str) -> Path:
    """The tokenized mixture again with one more `tokenize:` option, on the same store: its
    run directory, after checking that its encoders were reused (encoded once)."""
    d = tok_runs[0].parent.parent
    y = write_yaml(d / f"{name}.yaml", _mixture(demo_corpus).replace("name: remote", f"name: {name}").replace(
        "formats: [megatron, datatrove, memmap]}", f"formats: [megatron, datatrove, memmap], {option}}}"))
    r = curate("run", str(y), "--workers", "2", env=joined)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = atomic.read_json(d / "out" / name / "run.json")["steps"]
    assert all(rec[n]["status"] == "SKIPPED" for n in rec if n.startswith("tokenize-"))  # encoded once, reused
    return d / "out" / name


def _gpt2_json(tmp: Path) -> str:
    """GPT-2 as a tokenizer.json from the same offline files, for datatrove."""
    from tokenizers import ByteLevelBPETokenizer

    data = tokens._gpt2_files()
    tok = ByteLevelBPETokenizer(str(data / "encoder.json"), str(data / "vocab.bpe"))
    path = tmp / "gpt2.json"
    tok.save(str(path))
    return str(path)


def _mixture_texts(run: Path) -> dict[str, list[str]]:
    return {p.stem: pq.read_table(p, columns=["text"]).column("text").to_pylist()
            for p in sorted((run / "mixture").glob("part-*.parquet"))}


def test_token_files_equal_datatrove_writers_byte_for_byte(tok_runs, tmp_path, monkeypatch):
    from datatrove.data import Document
    from datatrove.pipeline.tokens.megatron_tokenizer import MegatronDocumentTokenizer
    from datatrove.pipeline.tokens.tokenizer import DocumentTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = tok_runs[0]
    tj = _gpt2_json(tmp_path)
    texts = _mixture_texts(run)
    assert len(texts) >= 2 and all(texts.values())
    for part, docs in texts.items():
        out = tmp_path / part
        items = [Document(text=t, id=str(i)) for i, t in enumerate(docs)]
        MegatronDocumentTokenizer(str(out / "m"), tokenizer_name_or_path=tj, eos_token="<|endoftext|>").run(iter(items))
        DocumentTokenizer(str(out / "d"), tokenizer_name_or_path=tj, eos_token="<|endoftext|>",
                          shuffle_documents=False).run(iter(items))
        for ours, theirs in ((".bin", "m/00000_tokens.bin"), (".idx", "m/00000_tokens.idx"),
                             (".ds", "d/00000_unshuffled.ds"), (".ds.index", "d/00000_unshuffled.ds.index")):
            fmt = "megatron" if ours in (".bin", ".idx") else "datatrove"
            a = (run / "tokenized" / fmt / f"{part}{ours}").read_bytes()
            assert a == (out / theirs).read_bytes(), (part, ours)
        meta = (run / "tokenized" / "datatrove" / f"{part}.ds.metadata").read_text().splitlines()
        theirs = (out / "d" / "00000_unshuffled.ds.metadata").read_text().splitlines()
        assert meta[0] == "gpt2|2" and meta[1:] == theirs[1:]  # the same count; the name is ours


def _read_megatron(base: Path) -> list[np.ndarray]:
    """Megatron-LM's IndexedDataset layout, read as its docs describe it."""
    idx = base.with_suffix(".idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00" and np.frombuffer(idx[9:17], "<u8")[0] == 1
    code = idx[17]
    dtype = {8: np.uint16, 4: np.int32}[code]
    n, ndocs = np.frombuffer(idx[18:34], "<u8")
    sizes = np.frombuffer(idx, "<i4", n, 34)
    ptrs = np.frombuffer(idx, "<i8", n, 34 + 4 * n)
    doc_idx = np.frombuffer(idx, "<i8", ndocs, 34 + 12 * n)
    assert doc_idx[0] == 0 and list(doc_idx) == list(range(n + 1))
    data = np.frombuffer(base.with_suffix(".bin").read_bytes(), dtype)
    return [data[p // dtype().itemsize: p // dtype().itemsize + s] for p, s in zip(ptrs, sizes)]


def test_every_document_decodes_to_its_mixture_text_and_counts_match_the_manifest(tok_runs):
    run = tok_runs[0]
    enc = tokens.load("gpt2")
    manifest = atomic.read_json(run / "manifest.json")
    tz = manifest["tokenized"]
    assert tz["eos_id"] == 50256 and tz["vocab_size"] == 50257 and tz["formats"]["megatron"]["dtype"] == "uint16"
    total = 0
    for p in sorted((run / "mixture").glob("part-*.parquet")):
        t = pq.read_table(p, columns=["text", "n_tokens"])
        docs = _read_megatron(run / "tokenized" / "megatron" / f"{p.stem}.bin")
        assert len(docs) == t.num_rows
        for d, text, n in zip(docs, t.column("text").to_pylist(), t.column("n_tokens").to_pylist(), strict=True):
            assert d[-1] == 50256 and 50256 not in d[:-1].tolist()  # EOS exactly at the boundary
            assert enc.decode(d[:-1].tolist()) == text and len(d) == n + 1
        total += sum(t.column("n_tokens").to_pylist()) + t.num_rows
    assert tz["formats"]["megatron"]["tokens"] == tz["formats"]["datatrove"]["tokens"] == total


def test_memmap_files_follow_dolmas_layout_and_trainer_configs_name_every_file(tok_runs):
    """Dolma's layout (its MemmapWriter: raw tokens, a csv row a document: start, end, id, src,
    loc): every document's span decodes to its mixture text; Megatron's --data-path and OLMo's
    data section name every file, weighted by tokens."""
    import csv
    import gzip
    import io

    run = tok_runs[0]
    enc = tokens.load("gpt2")
    for p in sorted((run / "mixture").glob("part-*.parquet")):
        t = pq.read_table(p, columns=["id", "source", "text"])
        data = np.fromfile(run / "tokenized" / "memmap" / f"{p.stem}.npy", np.uint16)
        rows = list(csv.reader(io.StringIO(gzip.decompress((run / "tokenized" / "memmap" / f"{p.stem}.csv.gz").read_bytes()).decode())))
        assert len(rows) == t.num_rows and int(rows[-1][1]) == len(data)
        for (start, end, doc_id, src, loc), i, s, text in zip(rows, t.column("id").to_pylist(), t.column("source").to_pylist(),
                                                             t.column("text").to_pylist(), strict=True):
            span = data[int(start):int(end)]
            assert (doc_id, src) == (i, s) and span[-1] == 50256 and enc.decode(span[:-1].tolist()) == text
    parts = sorted(p.stem for p in (run / "mixture").glob("part-*.parquet"))
    words = (run / "tokenized" / "megatron" / "data-path.txt").read_text().split()
    weights, prefixes = [float(w) for w in words[::2]], words[1::2]
    assert abs(sum(weights) - 1) < 1e-4 and [Path(x).name for x in prefixes] == parts
    assert all(Path(x + ".bin").is_file() and Path(x + ".idx").is_file() for x in prefixes)
    olmo = (run / "tokenized" / "memmap" / "olmo-data.yaml").read_text()
    assert "memmap_dtype: uint16" in olmo and all(f"{x}.npy" in olmo for x in parts)


def test_a_weights_only_edit_encodes_nothing_again(tok_runs):
    steps = atomic.read_json(tok_runs[1] / "run.json")["steps"]
    enc = {k: v for k, v in steps.items() if k.startswith("tokenize-")}
    assert set(enc) == {"tokenize-wiki", "tokenize-web"} and all(v["computed"] == 0 for v in enc.values()), enc
    assert all(steps[k]["computed"] > 0 for k in ("mix-route", "tokens-megatron", "tokens-datatrove", "tokens-memmap"))
    a, b = (json.dumps(atomic.read_json(r / "manifest.json")["tokenized"]["formats"]["megatron"]["tokens"]) for r in tok_runs)
    assert a != b  # the variant's token files hold its own mixture


def test_dtypes_and_specials_are_checked_where_the_yaml_sets_them():
    assert formats.dtype_for("megatron", "auto", 50257) == "uint16"
    assert formats.dtype_for("megatron", "auto", 128256) == "int32" and formats.dtype_for("datatrove", "auto", 128256) == "uint32"
    with pytest.raises(ValueError, match="65,536"):
        formats.dtype_for("datatrove", "uint16", 128256)
    with pytest.raises(ValueError, match="no uint32"):
        formats.dtype_for("megatron", "uint32", 50257)
    with pytest.raises(ValueError):
        TokenizeSpec(formats=["megatron", "megatron"])


def test_a_vocabulary_too_large_for_uint16_is_a_config_error_naming_the_key(tmp_path, demo_corpus):
    y = write_yaml(tmp_path / "t.yaml", small_mixture(str(demo_corpus), "out") + "\n        tokenize: {formats: [datatrove], dtype: uint32}\n")
    assert curate("plan", str(y)).returncode == 0
    big = tmp_path / "big.json"
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({f"w{i}": i for i in range(70_000)}, unk_token="w0")).save(str(big))
    y = write_yaml(tmp_path / "u.yaml", small_mixture(str(demo_corpus), "out") +
                   f"\n        tokenize: {{formats: [megatron], dtype: uint16, eos: false, tokenizer: {big}}}\n")
    r = curate("plan", str(y))
    assert r.returncode != 0 and "tokenize.dtype" in r.stderr and "65,536" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_explain_names_the_document_at_a_token(tok_runs):
    run = tok_runs[0]
    side = pq.read_table(run / "tokenized" / "megatron" / "part-00001.docs.parquet").to_pylist()
    doc = side[3]
    ids = pq.read_table(run / "mixture" / "part-00001.parquet", columns=["id"]).column("id").to_pylist()
    assert doc["id"] == ids[doc["row"]] and doc["start"] == side[2]["end"]
    r = curate("explain", str(run), "--token", f"tokenized/megatron/part-00001.bin:{doc['start'] + 1}")
    assert r.returncode == 0, r.stderr[-2000:]
    first = r.stdout.splitlines()[0]
    assert f"id {doc['id']}" in first and f"source {doc['source']}" in first and "document 3 " in first
    assert doc["id"] in r.stdout.split("\n", 1)[1]  # then its path through every stage
    r = curate("explain", str(run), "--token", "tokenized/megatron/part-00001.bin:999999999")
    assert r.returncode != 0 and "past its last token" in r.stderr and "Traceback" not in r.stderr


def test_verify_tokens_passes_and_catches_planted_faults(tok_runs, tmp_path, monkeypatch):
    import shutil

    from pipeline.views import tokens as token_view

    run = tok_runs[0]
    r = curate("verify-tokens", str(run))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-2000:]
    whole = token_view.verify(run)
    # files streamed in chunks of 97 tokens, which cut documents: the same verdict, every document decoded from its
    # pieces; the planted faults below are found through such chunks too
    monkeypatch.setattr(token_view, "CHUNK_TOKENS", 97)
    problems, summary = token_view.verify(run, sample=10**6)
    assert problems == [] and summary == whole[1]
    held = atomic.read_json(run / "manifest.json")["tokenized"]["formats"]["megatron"]["validation_files"]
    assert {f["path"].split("/")[3] for f in held} == {"web", "wiki"}  # tokenized/megatron/validation/<source>/part-...
    assert sum(f["documents"] for f in held) == sum(pq.read_metadata(p).num_rows for p in (run / "validation").rglob("*.parquet"))

    def planted(name):
        d = tmp_path / name
        shutil.copytree(run, d, symlinks=True)
        return d

    d = planted("eos")  # a wrong token where the first document's EOS is
    side = pq.read_table(d / "tokenized" / "megatron" / "part-00000.docs.parquet")
    b = d / "tokenized" / "megatron" / "part-00000.bin"
    data = np.fromfile(b, np.uint16)
    data[side.column("end")[0].as_py() - 1] = 13
    b.unlink()
    data.tofile(b)
    problems, _ = token_view.verify(d)
    assert any("lack EOS (50256) at their boundary" in p and "megatron/part-00000" in p for p in problems), problems

    d = planted("truncated")  # the .bin cut short by one token
    b = d / "tokenized" / "megatron" / "part-00000.bin"
    raw = b.read_bytes()
    b.unlink()
    b.write_bytes(raw[:-2])
    problems, _ = token_view.verify(d)
    assert any("megatron/part-00000" in p and "the manifest says" in p for p in problems), problems
    assert any("do not tile" in p for p in problems), problems

    d = planted("sha")  # issue 51, item 6: a token changed for another inside a document: the layout holds, and
    b = d / "tokenized" / "megatron" / "part-00000.bin"  # with no document sampled, only the manifest's sha256 tells
    data = np.fromfile(b, np.uint16)
    data[side.column("start")[0].as_py() + 2] ^= 1
    b.unlink()
    data.tofile(b)
    problems, _ = token_view.verify(d, sample=0)
    assert problems == ["tokenized/megatron/part-00000: part-00000.bin: sha256 " + problems[0].split("sha256 ")[1]], problems
    assert "is not the manifest's" in problems[0]

    d = planted("phase")  # issue 51, item 6: a phase named `validation` is a phase, not the held-out split
    m = atomic.read_json(d / "manifest.json")
    f0 = m["tokenized"]["formats"]["megatron"]["files"][0]
    assert f0["path"] == "tokenized/megatron/part-00000"
    (d / "tokenized" / "megatron" / "validation").mkdir(exist_ok=True)
    for name in f0["files"]:
        (d / "tokenized" / "megatron" / name).rename(d / "tokenized" / "megatron" / "validation" / name)
    (d / "mixture" / "validation").mkdir()
    shutil.copy(d / "mixture" / "part-00000.parquet", d / "mixture" / "validation" / "part-00000.parquet")  # other formats read it too
    f0["path"] = "tokenized/megatron/validation/part-00000"
    (d / "manifest.json").unlink()
    atomic.write_json(d / "manifest.json", m)
    problems, summary = token_view.verify(d, sample=10**6)
    assert problems == [] and summary["megatron"] == whole[1]["megatron"], problems

    d = planted("vocab")  # a vocabulary that uint16 cannot hold
    m = atomic.read_json(d / "manifest.json")
    m["tokenized"]["vocab_size"] = 70_000
    (d / "manifest.json").unlink()
    atomic.write_json(d / "manifest.json", m)
    r = curate("verify-tokens", str(d), "--sample", "5")
    assert r.returncode == 1 and "cannot hold the tokenizer's 70,000 ids" in r.stdout, r.stdout


def test_layout_cells_writes_a_dataset_per_cell_and_the_trainers_blends(tok_runs, demo_corpus, joined):
    """`layout: cells` on the same mixture and store: the encoders are reused; each cell's
    files hold exactly the mixture's documents of that cell (epochs included), in the
    mixture's order; the blends weigh each cell by its share of the tokens; verify-tokens
    checks every file against its mixture file."""
    import yaml

    run = tok_runs[0]
    cells_run = _variant(tok_runs, demo_corpus, joined, "cells", "layout: cells")
    man = atomic.read_json(cells_run / "manifest.json")["tokenized"]["formats"]
    mixed = atomic.read_json(cells_run / "manifest.json")["cells"]
    for fmt in ("megatron", "datatrove", "memmap"):
        got, want = [], []
        for f in man[fmt]["files"]:
            side = pq.read_table(cells_run / (f["path"] + ".docs.parquet")).to_pylist()
            assert f["path"].startswith(f"tokenized/{fmt}/{f['cell']}/part-") and {x["cell"] for x in side} == {f["cell"]}
            assert [x["row"] for x in side] == sorted(x["row"] for x in side)  # the mixture's order inside a cell
            got += [(f["mixture"], x["row"], x["id"], x["epoch"], x["end"] - x["start"]) for x in side]
        for f in atomic.read_json(run / "manifest.json")["tokenized"]["formats"][fmt]["files"]:
            side = pq.read_table(run / (f["path"] + ".docs.parquet")).to_pylist()
            want += [(f["path"].rsplit("/", 1)[1] + ".parquet", x["row"], x["id"], x["epoch"], x["end"] - x["start"])
                     for x in side]
        assert sorted(got) == sorted(want)  # the same documents, each where the mixture has it
        table = man[fmt]["cells"][""]
        assert set(table) == {c for c in mixed if mixed[c]["tokens"]}
        total = sum(t["tokens"] for t in table.values())
        for c, t in table.items():
            assert t["tokens"] == sum(f["tokens"] for f in man[fmt]["files"] if f["cell"] == c)
            assert abs(t["weight"] - t["tokens"] / total) < 1e-6
    parts = (cells_run / "tokenized" / "megatron" / "data-path.txt").read_text().split()
    weights = {}
    for w, p in zip(parts[::2], parts[1::2], strict=True):
        cell = Path(p).parent.name
        weights[cell] = weights.get(cell, 0.0) + float(w)
    cells_json = json.loads((cells_run / "tokenized" / "megatron" / "cells.json").read_text())
    assert all(abs(weights[c] - cells_json[c]["weight"]) < 1e-4 for c in cells_json)  # a cell's weight over its files
    mix = yaml.safe_load((cells_run / "tokenized" / "memmap" / "olmo-mix.yaml").read_text())
    assert {s["source_name"]: s["target_ratio"] for s in mix["source_mixture"]["sources"]} == \
        {c: t["weight"] for c, t in man["memmap"]["cells"][""].items()}
    folders = json.loads((cells_run / "tokenized" / "datatrove" / "folders.json").read_text())
    assert all(Path(v["folder"]).is_dir() for v in folders.values())
    r = curate("verify-tokens", str(cells_run))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-2000:]



def test_a_bos_that_is_the_eos_is_not_a_special_inside_a_document():
    """`bos: '<|endoftext|>'` with GPT-2: one id at both ends of every document; the scan
    (any chunking) finds nothing wrong, and still finds one planted inside a document."""
    from pipeline.views.tokens import _Scan

    eos = 50256
    docs = [[eos, 5, 6, eos], [eos, 7, eos], [eos, 8, 9, 10, eos]]
    data = np.array([t for d in docs for t in d], np.uint16)
    ends = np.cumsum([len(d) for d in docs])
    starts = ends - [len(d) for d in docs]
    for size in (1, 3, len(data)):
        scan = _Scan(starts, ends, eos, eos, [])
        for off in range(0, len(data), size):
            scan.add(off, data[off:off + size])
        assert scan.problems() == []
    data[5] = eos  # inside the second document
    scan = _Scan(starts, ends, eos, eos, [])
    scan.add(0, data)
    assert any("inside a document at token 5" in p for p in scan.problems())


def test_packing_fills_fixed_sequences_cutting_only_long_documents(tok_runs, demo_corpus, joined):
    """`pack: {seq_len: 256, strategy: best_fit}` on the same mixture and store: the encoders
    are reused; every file is whole sequences of 256 (Megatron's .idx lists them); only
    documents longer than a sequence are cut, and every document's pieces join to its tokens
    in the unpacked run; padding is EOS; verify-tokens passes; concat on the same documents
    cuts many more of them."""
    from pipeline.steps.tokenize.pack import pack

    run = tok_runs[0]
    d = run.parent.parent
    packed = _variant(tok_runs, demo_corpus, joined, "packed", "pack: {seq_len: 256}")
    man = atomic.read_json(packed / "manifest.json")["tokenized"]
    assert man["pack"] == {"seq_len": 256, "strategy": "best_fit"}
    unpacked = {}
    for f in atomic.read_json(run / "manifest.json")["tokenized"]["formats"]["megatron"]["files"]:
        data = np.fromfile(run / (f["path"] + ".bin"), np.uint16)
        for x in pq.read_table(run / (f["path"] + ".docs.parquet")).to_pylist():
            unpacked[(f["path"].rsplit("/", 1)[1], x["row"])] = data[x["start"]:x["end"]]
    cut = pads = 0
    for f in man["formats"]["megatron"]["files"]:
        data = np.fromfile(packed / (f["path"] + ".bin"), np.uint16)
        idx = (packed / (f["path"] + ".idx")).read_bytes()
        n = int(np.frombuffer(idx[18:26], "<u8")[0])
        assert len(data) == 256 * n == f["tokens"] and f["sequences"] == n
        assert np.all(np.frombuffer(idx, "<i4", n, 34) == 256)
        side = pq.read_table(packed / (f["path"] + ".docs.parquet")).to_pylist()
        by_doc: dict[int, list] = {}
        for x in side:
            assert x["end"] - x["start"] <= 256 and x["start"] // 256 == (x["end"] - 1) // 256  # a piece in one sequence
            by_doc.setdefault(x["row"], []).append(x)
        for row, pieces in by_doc.items():
            pieces.sort(key=lambda x: x["piece"])
            whole = np.concatenate([data[x["start"]:x["end"]] for x in pieces])
            assert np.array_equal(whole, unpacked[(f["path"].rsplit("/", 1)[1], row)])
            assert (len(pieces) > 1) == (len(whole) > 256)  # best fit cuts only what a sequence cannot hold
            cut += len(pieces) > 1
        covered = np.zeros(len(data), bool)
        for x in side:
            covered[x["start"]:x["end"]] = True
        assert np.all(data[~covered] == 50256)
        pads += int((~covered).sum())
        assert f["padding"] == int((~covered).sum()) and f["documents"] == len(by_doc)
    docs = list(unpacked.values())
    lengths = np.array([len(x) for x in docs])
    _, pc = pack(np.concatenate(docs), lengths, 256, "concat", 50256)
    concat_cut = int(np.sum(np.bincount(pc["doc"]) > 1))
    total = int(lengths.sum())
    print(f"\nbest_fit at 256: {cut} of {len(docs)} documents cut, padding {pads / (total + pads):.2%}; "
          f"concat: {concat_cut} cut")
    assert cut < concat_cut
    r = curate("verify-tokens", str(packed))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-2000:]
    pad_at = int(np.flatnonzero(~covered)[0])  # of the last file
    r = curate("explain", str(packed), "--token", f"{f['path']}.bin:{pad_at}")
    assert r.returncode != 0 and "is padding" in r.stderr and "Traceback" not in r.stderr, r.stderr[-1000:]
    import shutil

    from pipeline.views import tokens as token_view

    bad = d / "packed-bad"  # a padding token that is not EOS
    shutil.copytree(packed, bad, symlinks=True)
    b = bad / (f["path"] + ".bin")
    data = data.copy()
    data[pad_at] = 13
    b.unlink()
    data.tofile(b)
    problems, _ = token_view.verify(bad, sample=5)
    assert any(f"padding at token {pad_at:,} is not EOS" in p for p in problems), problems


def test_pack_needs_an_end_of_text_to_pad_with(tmp_path, demo_corpus):
    y = write_yaml(tmp_path / "x.yaml", small_mixture(str(demo_corpus), "out") +
                   "\n        tokenize: {formats: [megatron], eos: false, pack: {seq_len: 128}}\n")
    r = curate("plan", str(y))
    assert r.returncode != 0 and "tokenize.pack: packing pads sequences with the end-of-text token" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_files_split_between_documents_and_keep_empty_ones_packed_or_not():
    """`max_file_tokens` splits a run of documents between documents: packed, each file's
    documents are packed on their own, so no document is in two files; unpacked, an empty
    document (eos: false) keeps its sidecar row; a cell's blend weight leaves padding out."""
    from pipeline.steps.tokenize import blends
    from pipeline.steps.tokenize.tasks import _pieces

    lengths = np.array([3, 5, 2, 6, 0])
    ids = np.arange(1, int(lengths.sum()) + 1, dtype=np.uint32)
    for strategy in ("concat", "best_fit"):
        files = list(_pieces(ids, lengths, {"max_file_tokens": 8, "pack": {"seq_len": 4, "strategy": strategy}, "eos_id": 0}))
        seen = [set(pc["doc"].tolist()) for _, _, pc in files]
        assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1:])  # a document in one file only
        assert set().union(*seen) == {0, 1, 2, 3}  # the empty document has no tokens to place
        for tok, seqs, pc in files:
            assert len(tok) == 4 * len(seqs) and all(np.all(tok[s:e] != 0) for s, e in zip(pc["start"], pc["end"]))
    files = list(_pieces(ids, lengths, {"max_file_tokens": 8}))
    assert [pc["doc"].tolist() for _, _, pc in files] == [[0, 1], [2, 3, 4]]
    assert files[-1][2]["start"].tolist() == [0, 2, 8] and files[-1][2]["end"].tolist() == [2, 8, 8]
    b = {"files": [{"path": "tokenized/megatron/a/part-00000", "cell": "a", "tokens": 8, "padding": 3, "documents": 1},
                   {"path": "tokenized/megatron/b/part-00000", "cell": "b", "tokens": 8, "padding": 0, "documents": 2}]}
    g = blends._groups("megatron", b)[""]
    assert g["a"]["tokens"] == 5 and g["b"]["tokens"] == 8


def test_best_fit_fills_sequences_it_has_opened_before_opening_another():
    """Best-fit decreasing on pieces 4, 3, 2, 2, 1, 1 (documents of 3, 1, 2, 2, 5 tokens at
    seq_len 4): four sequences, not one a piece; every token in place, padding EOS."""
    from pipeline.steps.tokenize.pack import pack

    lengths = np.array([3, 1, 2, 2, 5])
    ids = np.arange(1, int(lengths.sum()) + 1, dtype=np.uint16)
    out, pc = pack(ids, lengths, 4, "best_fit", 0)
    assert len(out) == 16 and int((out == 0).sum()) == 3 and out.dtype == ids.dtype
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    for d, p, s, e in zip(pc["doc"].tolist(), pc["piece"].tolist(), pc["start"].tolist(), pc["end"].tolist()):
        a = starts[d] + 4 * p
        assert out[s:e].tolist() == ids[a : a + e - s].tolist() and s // 4 == (e - 1) // 4  # a piece in one sequence
    assert sorted(pc["end"] - pc["start"]) == [1, 1, 2, 2, 3, 4]
