"""A task computes with the driver's settings, never its worker's environment
(engine/where.py `driver_env`): run_shard gets them with its arguments and sets them before
the task runs, whatever the worker process had."""

from __future__ import annotations

import os

from pipeline.engine.step import Step, task
from pipeline.engine.task import run_shard
from pipeline.engine.where import Where, driver_env


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


def test_every_shard_the_executor_starts_carries_the_drivers_settings(tmp_path, monkeypatch):
    """Where._args builds the arguments of every shard, inline, in a local pool or on Ray:
    they end with the driver's settings, and run_shard applies them."""
    class W(Where):
        store = tmp_path

        def fence(self, s):
            return None

    s = Step("probe", "probe", {}, [], probe, shards=lambda st, stats: [{}])
    s.meta["keys"] = ["k0"]
    monkeypatch.setenv("CURATE_NATIVE", "0")  # the driver's
    args = W()._args(s, 0, {})
    assert args[-1] == {"CURATE_NATIVE": "0"}
    monkeypatch.setenv("CURATE_NATIVE", "1")  # a worker process with another shell
    assert run_shard(*args)["native"] == "0"
