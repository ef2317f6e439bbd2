"""Read keys (pipeline/shards/readkey.py): what a task reads of a document shard's layers,
digested. The same keep mask and texts give the same key whatever else a layer holds; a
changed keep, text or decision row changes it."""

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.shards import readkey


def _shard(tmp_path, layers: list[dict]) -> tuple[str, list[str]]:
    docs = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["x", "y", "z"]}), docs)
    paths = []
    for i, cols in enumerate(layers):
        p = tmp_path / f"layer{i}.parquet"
        pq.write_table(pa.table(cols), p)
        paths.append(str(p))
    return str(docs), paths


def test_other_columns_of_a_layer_do_not_change_the_key(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    d1, l1 = _shard(tmp_path / "1", [{"keep": [True, False, None], "cluster_size": [None, 2, None]}])
    d2, l2 = _shard(tmp_path / "2", [{"keep": [True, False, None], "cluster_size": [None, 3, None]}])
    assert readkey.view(d1, l1) == readkey.view(d2, l2)


def test_keep_text_and_decisions_change_the_key(tmp_path):
    for k in "123":
        (tmp_path / k).mkdir()
    d1, l1 = _shard(tmp_path / "1", [{"keep": [True, True, None]}])
    d2, l2 = _shard(tmp_path / "2", [{"keep": [True, False, None]}])
    d3, l3 = _shard(tmp_path / "3", [{"keep": [True, True, None], "text": [None, "y2", None]}])
    keys = {readkey.view(d1, l1), readkey.view(d2, l2), readkey.view(d3, l3)}
    assert len(keys) == 3
    # a text override is read only when asked for
    assert readkey.view(d3, l3, ("n_chars",)) == readkey.view(d1, l1, ("n_chars",))
    dec = pa.table({"row": [1], "jaccard": [float("nan")]})
    null = pa.table({"row": [1], "jaccard": pa.array([None], pa.float64())})
    assert len({readkey.view(d1, l1, (), None), readkey.view(d1, l1, (), dec), readkey.view(d1, l1, (), null)}) == 3


def test_the_key_covers_values_not_chunks(tmp_path):
    d, ls = _shard(tmp_path, [{"keep": [True, True, True]}])
    one = pa.table({"row": [0, 1, 2], "reason": ["a", None, "c"]})
    two = pa.concat_tables([one.slice(0, 1), one.slice(1, 2)])
    assert two.column("row").num_chunks == 2
    assert readkey.view(d, ls, (), one) == readkey.view(d, ls, (), two)
