"""Integer settings from the environment (pipeline/errors.py `env_int`): every knob that
benches and tests turn reads through it (the `engine:` section's overrides through
pipeline/config/engine.py), and a bad value names the variable and the fix."""

from __future__ import annotations

import pytest

from pipeline.config import engine
from pipeline.engine import pool
from pipeline.errors import UsageError, env_int
from pipeline.run import runner


def test_env_int_reads_the_setting_or_the_default_and_names_a_bad_value(monkeypatch):
    monkeypatch.delenv("CURATE_X", raising=False)
    assert env_int("CURATE_X", 32, "a group") == 32
    monkeypatch.setenv("CURATE_X", " 7 ")
    assert env_int("CURATE_X", 32, "a group", least=2) == 7
    for bad in ("1", "-3", "2.5", "many"):
        monkeypatch.setenv("CURATE_X", bad)
        with pytest.raises(UsageError) as e:
            env_int("CURATE_X", 32, "a group", least=2)
        assert str(e.value) == f"CURATE_X={bad!r}: give a group (2 or more), or unset it for 32"


def _engine(key):
    return lambda: engine.with_env(engine.EngineSpec())[0].model_dump()[key]


@pytest.mark.parametrize("name, read, value", [
    ("CURATE_SHUFFLE_GROUP", _engine("shuffle_group"), 4), ("CURATE_SHUFFLE_FANIN", _engine("shuffle_fanin"), 3),
    ("CURATE_MERGE_BYTES", _engine("merge_bytes"), 3000), ("CURATE_FUZZY_SALT_ROWS", _engine("fuzzy_salt_rows"), 40),
    ("CURATE_FUZZY_LOCAL_EDGES", _engine("fuzzy_local_edges"), 0), ("CURATE_SELECT_GROUP", _engine("select_group"), 2),
    ("CURATE_INLINE_DOCS", runner.inline_docs, 0), ("CURATE_LOCAL_BYTES", pool.local_bytes, 1000),
])
def test_each_knob_reads_through_it(monkeypatch, name, read, value):
    monkeypatch.setenv(name, str(value))
    assert read() == value
    monkeypatch.setenv(name, "x")
    with pytest.raises(UsageError, match=f"^{name}='x': give "):
        read()
