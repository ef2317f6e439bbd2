"""The second half of the suite's seeded edit fuzzing (tests/pipeline/engine/test_fuzz_reuse.py
has the first and says what it checks; two files, so that the halves run in parallel): 20
random edits of every kind from another seed, then two variants at once in the shared store."""

from __future__ import annotations

import pytest

from bench import fuzz_edits as fe
from tests.pipeline.engine.test_fuzz_reuse import SEED, check_random_edits

pytestmark = pytest.mark.e2e  # runs the pipeline (inline: no Ray)


def test_more_random_edits_and_concurrent_variants_give_the_bytes_of_a_fresh_run(tmp_path):
    from tests.conftest import WHEEL_DIR

    check_random_edits(fe.Library.build(tmp_path / "lib", WHEEL_DIR), tmp_path, SEED + 1)
