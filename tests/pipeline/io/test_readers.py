"""Readers on real files: every format, and splits of large files that lose and repeat nothing."""

from __future__ import annotations

import gzip

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.io import readers
from pipeline.io.discover import InputFile, infer_format
from pipeline.steps.ingest import splits as ingest


def _records(texts):
    return [{"text": t, "n": i} for i, t in enumerate(texts)]


def _jsonl(recs, blank_every=0) -> bytes:
    out = []
    for i, r in enumerate(recs):
        out.append(orjson.dumps(r) + b"\n")
        if blank_every and i % blank_every == 0:
            out.append(b"\n")
    return b"".join(out)


def _file(path, fmt="jsonl", comp=None) -> dict:
    st = path.stat()
    return InputFile(str(path), path.name, fmt, comp, st.st_size, st.st_mtime_ns).to_dict()


def _arrow_rows(batches) -> list[int]:
    """The `n` column over (first row, batch) pairs, checking each batch's row number."""
    rows = []
    for first, batch in batches:
        ns = batch.column("n").to_pylist()
        assert ns[0] == first
        rows += ns
    return rows


def _read_all(f: dict, splits: list[dict]):
    got = []
    for sp in splits:
        for item in readers.iter_lines(f["path"], f["compression"], sp):
            assert not isinstance(item, readers.StreamError), item
            line_no, _, raw = item
            if raw.strip():
                got.append((line_no, orjson.loads(raw)["n"]))
    return got


@pytest.mark.parametrize("suffix,comp", [(".jsonl", None), (".jsonl.gz", "gzip"), (".jsonl.zst", "zstd")])
def test_jsonl_every_compression(tmp_path, wiki_texts, suffix, comp):
    recs = _records(wiki_texts[:300])
    data = _jsonl(recs)
    p = tmp_path / f"a{suffix}"
    p.write_bytes(gzip.compress(data) if comp == "gzip" else zstandard.ZstdCompressor().compress(data) if comp == "zstd" else data)
    assert infer_format(p) == ("jsonl", comp)
    got = _read_all(_file(p, comp=comp), [{}])
    assert got == [(i + 1, i) for i in range(300)]


def test_uncompressed_jsonl_split_by_byte_ranges(tmp_path, wiki_texts):
    # blank lines in between: line numbers must still be the file's own
    data = _jsonl(_records(wiki_texts[:3000]), blank_every=7)
    p = tmp_path / "big.jsonl"
    p.write_bytes(data)
    f = _file(p)
    splits = ingest.plan_splits([f], {"max_shard_rows": 10**9, "max_shard_bytes": 64 << 10}, {})
    assert len(splits) == -(-len(data) // (64 << 10)) and len(splits) > 10
    got = _read_all(f, splits)
    assert [n for _, n in got] == list(range(3000))  # each record once, in order
    lines = data.split(b"\n")
    for line_no, n in got[::97]:
        assert orjson.loads(lines[line_no - 1])["n"] == n


def test_compressed_jsonl_split_by_record_ranges(tmp_path, wiki_texts):
    data = _jsonl(_records(wiki_texts[:2500]))
    p = tmp_path / "big.jsonl.zst"
    p.write_bytes(zstandard.ZstdCompressor().compress(data))
    f = _file(p, comp="zstd")
    counts = readers.count_lines(str(p), "zstd")
    assert counts == {"lines": 2500, "broken": None}
    splits = ingest.plan_splits([f], {"max_shard_rows": 400, "max_shard_bytes": 1 << 20}, {str(p): 2500})
    assert len(splits) == 7 and splits[-1]["last"] is None
    assert [n for _, n in _read_all(f, splits)] == list(range(2500))


def test_parquet_split_by_row_groups(tmp_path, wiki_texts):
    p = tmp_path / "w.parquet"
    pq.write_table(pa.Table.from_pylist(_records(wiki_texts[:2500])), p, row_group_size=300)
    f = _file(p, fmt="parquet")
    splits = ingest.plan_splits([f], {"max_shard_rows": 1000, "max_shard_bytes": 1 << 20}, {})
    assert [s["row_groups"] for s in splits] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert [s["first_row"] for s in splits] == [0, 900, 1800]
    rows = [n for sp in splits for n in _arrow_rows(readers.iter_parquet(str(p), sp, ["n"], 128))]
    assert rows == list(range(2500))


def test_hf_saved_dataset_split_by_rows(tmp_path, wiki_texts):
    import datasets

    d = tmp_path / "hfds"
    datasets.Dataset.from_list(_records(wiki_texts[:1000])).save_to_disk(str(d))
    assert infer_format(d) == ("hf", None)
    f = _file(d, fmt="hf")
    splits = ingest.plan_splits([f], {"max_shard_rows": 300, "max_shard_bytes": 1 << 20}, {})
    assert [(s["first_row"], s["last_row"]) for s in splits] == [(0, 300), (300, 600), (600, 900), (900, 1000)]
    rows = [n for sp in splits for n in _arrow_rows(readers.iter_hf(str(d), None, sp, 128))]
    assert rows == list(range(1000))


def test_hf_dataset_dict_needs_a_split(tmp_path, wiki_texts):
    import datasets

    d = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(_records(wiki_texts[:10]))}).save_to_disk(str(d))
    with pytest.raises(KeyError, match="DatasetDict with splits train; set hf_split"):
        readers.load_hf(str(d), None)
    assert len(readers.load_hf(str(d), "train")) == 10


def test_corrupt_zstd_keeps_records_before_the_break(tmp_path, wiki_texts):
    cctx = zstandard.ZstdCompressor()
    good = cctx.compress(_jsonl(_records(wiki_texts[:50])))
    p = tmp_path / "broken.jsonl.zst"
    p.write_bytes(good + b"\x28\xb5\x2f\xfd" + b"garbage-not-a-frame" * 20)
    items = list(readers.iter_lines(str(p), "zstd", {}))
    assert [i[0] for i in items[:-1]] == list(range(1, 51))
    assert isinstance(items[-1], readers.StreamError) and items[-1].line_no == 51
