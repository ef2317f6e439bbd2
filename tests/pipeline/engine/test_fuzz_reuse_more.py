"""The second half of the suite's seeded edit fuzzing (tests/pipeline/engine/test_fuzz_reuse.py
has the first; two files, so the two halves run in parallel): random edits of every kind,
and every few edits two variants run at once in the shared store (two `curate run`
processes), each compared with a fresh run."""

from __future__ import annotations

import json

import pytest

from bench import fuzz_edits as fe
from bench import fuzz_reuse as fr
from tests.pipeline.engine.test_fuzz_reuse import SEED

pytestmark = pytest.mark.e2e  # runs the pipeline (inline: no Ray)


def test_random_edits_and_concurrent_variants_give_the_bytes_of_a_fresh_run(tmp_path):
    from tests.conftest import WHEEL_DIR

    lib = fe.Library.build(tmp_path / "lib", WHEEL_DIR)
    res = fr.fuzz(22, SEED + 1, tmp_path, None, concurrent_every=11, lib=lib, stop_at_first=True)
    assert res["differences"] == 0, json.dumps(res["found"], indent=1, default=str)
    assert res["edits"] == 22 and res["kinds"]["concurrent"] == 4
    assert set(res["kinds"]) == set(fe.EDITS) | {"concurrent"}  # every kind of edit at least once
