"""Shuffle segments without framing (pipeline/shards/shuffle.py `RAW_ROWS`): a small segment
of fixed-width numbers and short strings is its columns' bytes, a large one, one with texts
or with a null an Arrow IPC stream; readers and merges give the same rows in the same order whichever each
segment is, and a raw segment is a fraction of a stream's bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.shards import shuffle


def _write(tmp, i, t, parts, nparts):
    shuffle.write_partitions(t, parts, nparts, shuffle.map_file(tmp / "maps", i))


def test_raw_and_stream_segments_read_back_as_the_rows_written(tmp_path):
    rng = np.random.default_rng(5)
    nparts, nmaps = 40, 6
    expected: dict[int, list] = {p: [] for p in range(nparts)}
    for i in range(nmaps):
        n = [30, 5000, 0, 80, 3000, 12][i]  # small segments (raw) and large ones (streams) in one file
        t = pa.table({"bucket": rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64),
                      "gid": rng.integers(0, 2**40, n), "w": rng.random(n).astype(np.float32),
                      "r": rng.integers(0, 100, n).astype(np.int32)})
        if i == 3:  # a null in a column: raw segments carry it (its validity bits), the schema the same
            t = t.set_column(1, "gid", pa.array([None] + t.column("gid").to_pylist()[1:], pa.int64()))
        parts = rng.integers(0, nparts, n)
        if n:
            _write(tmp_path, i, t, parts, nparts)
        else:
            shuffle.write_empty(nparts, shuffle.map_file(tmp_path / "maps", i))
        order = np.argsort(parts, kind="stable")
        for j in order.tolist():
            expected[int(parts[j])].append({c: t.column(c)[j].as_py() for c in t.column_names})
    schema = pa.schema([("bucket", pa.uint64()), ("gid", pa.int64()), ("w", pa.float32()), ("r", pa.int32())])
    for p in range(nparts):
        got = shuffle.read_partition(tmp_path / "maps", nmaps, p, schema)
        assert got.schema == schema and got.to_pylist() == expected[p], p
    # merged (whole and in partition ranges): raw and stream segments of one partition back to back
    shuffle.merge(tmp_path / "maps", 0, nmaps, shuffle.map_file(tmp_path / "merged", 0))
    for r in range(3):
        shuffle.merge(tmp_path / "maps", 0, nmaps, shuffle.map_file(tmp_path / "ranges", r), span=(r, 3))
    for p in range(nparts):
        want = expected[p]
        assert shuffle.read_partition(tmp_path / "merged", 1, p, schema).to_pylist() == want
        assert shuffle.read_partition(tmp_path / "ranges", [1, 3, nparts], p, schema).to_pylist() == want
    data = (shuffle._with(shuffle.map_file(tmp_path / "maps", 0), ".data")).read_bytes()
    assert data.startswith(shuffle._RAW_MAGIC2)  # map 0's 30 rows over 40 partitions: raw segments


def test_a_raw_segment_is_a_fraction_of_a_streams_bytes_whatever_its_columns(tmp_path):
    rng = np.random.default_rng(1)
    n, nparts = 600, 200  # 3 rows a partition: as band keys over partitions that grow with the corpus
    t = pa.table({"bucket": rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64), "gid": rng.integers(0, 2**40, n)})
    parts = rng.integers(0, nparts, n)
    _write(tmp_path, 0, t, parts, nparts)
    raw = shuffle._with(shuffle.map_file(tmp_path / "maps", 0), ".data").stat().st_size
    per_segment = raw / len(np.unique(parts))
    streams = sum(len(shuffle._stream_bytes(t.filter(pa.array(parts == p)))) for p in np.unique(parts))
    assert raw * 4 < streams, (raw, streams)  # 16 bytes a row plus a ~40-byte header, against ~450 bytes of framing
    assert per_segment < 16 * n / len(np.unique(parts)) + 50
    # ids (short strings) go raw, as exact and paragraph keys carry them
    ids = pa.table({"h1": np.arange(4, dtype=np.uint64), "id": pa.array(["a", "", "ccc", "é"]), "gid": pa.array([1, 2, 3, 4])})
    shuffle.write_partitions(ids, np.array([0, 1, 1, 1]), 2, shuffle.map_file(tmp_path / "s", 0))
    assert shuffle._with(shuffle.map_file(tmp_path / "s", 0), ".data").read_bytes().startswith(shuffle._RAW_MAGIC2)
    got = shuffle.read_partition(tmp_path / "s", 1, 1)
    assert got.schema == ids.schema and got.to_pylist() == ids.slice(1).to_pylist()
    # the mixture's route: fourteen columns, texts, token ids, nulls, about a document a partition at scale:
    # raw (compressed past a KB) takes what the rows take, where a stream's framing was ~2.5 KB a segment
    texts = [" ".join(rng.choice(["the", "page", "of", "a", "crawl", "with", "words"], 400)) for _ in range(40)]
    route = pa.table({"id": [f"d{i}" for i in range(40)], "text": texts, "source": ["web"] * 40,
                      "source_id": [f"f.jsonl:{i}" for i in range(40)], "n_tokens": pa.array(range(40), pa.int64()),
                      "quality_score": pa.array([None if i % 3 else 0.5 for i in range(40)], pa.float32()),
                      "quality_bucket": pa.array([i % 5 for i in range(40)], pa.int16()),
                      "topic": pa.array([None] * 40, pa.string()), "topic_score": pa.array([None] * 40, pa.float32()),
                      "lang": ["en"] * 40, "tokens": pa.array([bytes(range(i)) for i in range(40)], pa.large_binary()),
                      "epoch": pa.array([0] * 40, pa.int32()), "order": pa.array(range(40), pa.uint64()), "cell": ["web"] * 40})
    shuffle.write_partitions(route, np.arange(40), 40, shuffle.map_file(tmp_path / "t", 0))
    data = shuffle._with(shuffle.map_file(tmp_path / "t", 0), ".data").read_bytes()
    framed = sum(len(shuffle._stream_bytes(route.slice(i, 1))) for i in range(40))
    assert data.startswith(shuffle._RAW_MAGIC2) and len(data) * 2 < framed, (len(data), framed)
    for p in (0, 7, 39):
        assert shuffle.read_partition(tmp_path / "t", 1, p).equals(route.slice(p, 1))
