"""Read keys (pipeline/shards/readkey.py): what a task reads of a document shard's layers,
digested. The same keep mask and texts give the same key whatever else a layer holds; a
changed keep, text or decision row changes it."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.shards import readkey, view


def key(documents: str, layers: list[str], *more) -> str:
    return readkey.shard({"documents": documents, "layers": layers}, *more)[0]


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
    assert key(d1, l1) == key(d2, l2)


def test_keep_text_and_decisions_change_the_key(tmp_path):
    for k in "123":
        (tmp_path / k).mkdir()
    d1, l1 = _shard(tmp_path / "1", [{"keep": [True, True, None]}])
    d2, l2 = _shard(tmp_path / "2", [{"keep": [True, False, None]}])
    d3, l3 = _shard(tmp_path / "3", [{"keep": [True, True, None], "text": [None, "y2", None]}])
    keys = {key(d1, l1), key(d2, l2), key(d3, l3)}
    assert len(keys) == 3
    # a text override is read only when asked for
    assert key(d3, l3, ("n_chars",)) == key(d1, l1, ("n_chars",))
    dec = pa.table({"row": [1], "jaccard": [float("nan")]})
    null = pa.table({"row": [1], "jaccard": pa.array([None], pa.float64())})
    assert len({key(d1, l1, (), None), key(d1, l1, (), dec), key(d1, l1, (), null)}) == 3


def test_the_key_covers_values_not_chunks(tmp_path):
    d, ls = _shard(tmp_path, [{"keep": [True, True, True]}])
    one = pa.table({"row": [0, 1, 2], "reason": ["a", None, "c"]})
    two = pa.concat_tables([one.slice(0, 1), one.slice(1, 2)])
    assert two.column("row").num_chunks == 2
    assert key(d, ls, (), one) == key(d, ls, (), two)


def test_strings_are_keyed_by_their_bytes_and_a_slice_by_its_values(tmp_path):
    """Strings are hashed from their offsets and bytes: a sliced array (an offset into its
    buffers) keys as the same values copied, and one changed character changes the key."""
    d, ls = _shard(tmp_path, [{"keep": [True, True, True]}])
    whole = pa.table({"reason": ["a", "bb", None, "ccc"]})
    part, copy = whole.slice(1, 3), pa.table({"reason": ["bb", None, "ccc"]})
    assert key(d, ls, (), part) == key(d, ls, (), copy) != key(d, ls, (), pa.table({"reason": ["bb", None, "ccd"]}))
    assert key(d, ls, (), pa.table({"reason": ["ab", "c"]})) != key(d, ls, (), pa.table({"reason": ["a", "bc"]}))


def _task_steps():
    from pipeline.shards import apply
    from pipeline.steps import decontam
    from pipeline.steps.classify import quality
    from pipeline.steps.dedup import exact, fuzzy, paragraph
    from pipeline.steps.mix import tasks as mix
    from pipeline.steps.samples import tasks as samples
    from pipeline.steps.tokenize import tasks as tokenize

    return {"tokenize-web": tokenize.encode_shard, "classify-score": quality.score_shard,
            "dedup-paragraph-map": paragraph.map_shard, "dedup-paragraph": paragraph.apply_shard,
            "dedup-exact": apply.run_shard, "dedup-exact-map": exact.map_shard,
            "dedup-fuzzy-signatures": fuzzy.sig_shard, "decontaminate": decontam.apply_shard,
            "mix-route": mix.route_shard, "samples-pick": samples.pick_shard}


@pytest.mark.parametrize("name", list(_task_steps()))
def test_a_task_links_what_it_read_before_and_computes_what_changed(demo_run, tmp_path, name):
    """Cutoff by what a task reads, task by task, on a real run's shard: a layer that gains a
    column the task does not read (as a dedup layer's `cluster_size` changes when a new page
    joins an old page's cluster) leaves its read key: the earlier shard's files are linked,
    byte for byte. A layer whose keep mask changed is computed."""
    import orjson

    from pipeline.engine.cutoff import hint
    from pipeline.engine.step import read_markers
    from pipeline.engine.task import run_shard

    fn = _task_steps()[name]
    steps = orjson.loads((demo_run / "run.json").read_bytes())["steps"]
    step = name if name != "classify-score" else next(s for s in steps if s.startswith("classify-") and s.endswith("-web")
                                                          and not s.endswith(("-train", "-examples")))
    folder = (demo_run / steps[step]["dir"]).resolve()
    shards = orjson.loads((folder / "step.json").read_bytes())["shards"]
    i, spec = next((i, x) for i, x in enumerate(shards) if _layers(x))  # a shard with layers
    marker = read_markers(folder)[i]
    assert "read_key" in marker and "partial_key" in marker and _layers(spec)  # the step declares read_keyed

    def with_last_layer(change) -> dict:
        t = pq.read_table(_layers(spec)[-1])
        p = tmp_path / f"layer-{change.__name__}.parquet"
        pq.write_table(change(t), p)
        return {**_with_layers(spec, _layers(spec)[:-1] + [str(p)]), "prior": hint((folder, i, marker))}

    def other_column(t):  # what explain shows of a cluster: read by no task
        t = t.drop_columns(["cluster_size"]) if "cluster_size" in t.column_names else t
        return t.append_column("cluster_size", pa.array(range(t.num_rows)))

    documents = spec["doc"]["documents"] if "doc" in spec else spec["documents"]
    kept = view.Layers(_layers(spec), view.num_rows(documents), ()).keep

    def one_removed(t):  # a row every layer kept
        keep = t.column("keep").to_pylist()
        j = int(kept.nonzero()[0][0])
        keep[j] = False
        return t.set_column(t.schema.get_field_index("keep"), "keep", pa.array(keep, pa.bool_()))

    task = f"{fn.__module__}:{fn.__qualname__}"
    same = run_shard(task, with_last_layer(other_column), str(tmp_path / "same"), i)
    assert same.get("linked_from") == folder.name and same["out_files"] == marker["out_files"], same
    # and computed from scratch on that layer (no earlier shard to link), the task writes those same bytes:
    # what its read key leaves out is what its output does not depend on
    fresh = run_shard(task, {k: v for k, v in with_last_layer(other_column).items() if k != "prior"}, str(tmp_path / "fresh"), i)
    assert "linked_from" not in fresh and fresh["out_files"] == marker["out_files"], fresh
    changed = run_shard(task, with_last_layer(one_removed), str(tmp_path / "changed"), i)
    assert "linked_from" not in changed and changed["read_key"] != marker["read_key"]


def _layers(spec: dict) -> list[str]:
    """A shard spec's layer files: a document shard's (`doc`), or the picks' [stage, file] pairs."""
    return spec["doc"]["layers"] if "doc" in spec else [p for _, p in spec["layers"]]


def _with_layers(spec: dict, layers: list[str]) -> dict:
    if "doc" in spec:
        return {**spec, "doc": {**spec["doc"], "layers": layers}}
    return {**spec, "layers": [[label, p] for (label, _), p in zip(spec["layers"], layers, strict=True)]}
