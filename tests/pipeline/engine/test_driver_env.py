"""A task computes with the driver's settings, never its worker's environment
(engine/where.py `driver_env`): run_shard gets them with its arguments and sets them before
the task runs, whatever the worker process had."""

from __future__ import annotations

import os

from pipeline.engine.step import task
from pipeline.engine.task import run_shard
from pipeline.engine.where import driver_env


@task(version="1")
def probe(spec: dict, out) -> dict:
    return {"rows": 0, "native": os.environ.get("CURATE_NATIVE")}


def test_the_driver_decides_what_a_worker_computes_with(tmp_path, monkeypatch):
    fn = f"{__name__}:probe"
    monkeypatch.setenv("CURATE_NATIVE", "1")  # the worker's own shell
    assert run_shard(fn, {}, str(tmp_path / "a"), 0, env={"CURATE_NATIVE": "0"})["native"] == "0"
    assert run_shard(fn, {}, str(tmp_path / "b"), 0, env={"CURATE_NATIVE": ""})["native"] is None  # unset on the driver
    monkeypatch.setenv("CURATE_NATIVE", "0")
    assert driver_env() == {"CURATE_NATIVE": "0"}
    monkeypatch.delenv("CURATE_NATIVE")
    assert driver_env() == {"CURATE_NATIVE": ""}
