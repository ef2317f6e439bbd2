"""A shard linked from an earlier folder is linked whole or not at all (issue 69): a file of
it gone since (a gc) or a failure midway leaves no part of it in the new folder."""

from __future__ import annotations

import pytest

from pipeline.engine import reuse
from pipeline.io import fs


def test_a_link_that_fails_halfway_leaves_nothing(tmp_path):
    old, new = tmp_path / "steps" / "s-old", tmp_path / "steps" / "s-new"
    (old / "keys").mkdir(parents=True)
    (old / "part-00003.parquet").write_bytes(b"a")
    (old / "keys" / "part-00003.parquet").write_bytes(b"b")
    marker = {"out_files": {"part-00003.parquet": "d1", "keys/part-00003.parquet": "d2", "zz/part-00003.parquet": "d3"}}
    assert reuse.link_shard(old, 3, marker, new, 5) is None  # zz/ was collected: the shard is computed instead
    assert not [p for p in new.rglob("*") if p.is_file()]  # the two files linked before it are gone again
    del marker["out_files"]["zz/part-00003.parquet"]
    m = reuse.link_shard(old, 3, marker, new, 5)
    assert sorted(m["out_files"]) == ["keys/part-00005.parquet", "part-00005.parquet"] and m["reused_from"] == "s-old"
    assert (new / "keys" / "part-00005.parquet").read_bytes() == b"b"


def test_link_all_removes_what_it_made_before_an_error(tmp_path):
    """A real failure on the second file (its folder's name is taken by a file): the first
    link is removed and the error raised."""
    (tmp_path / "a").write_bytes(b"1")
    (tmp_path / "b").write_bytes(b"2")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "blocked").write_bytes(b"a file where a folder should be")
    with pytest.raises(OSError):
        fs.link_all([(tmp_path / "a", tmp_path / "out" / "a"), (tmp_path / "b", tmp_path / "out" / "blocked" / "b")])
    assert not (tmp_path / "out" / "a").exists()
