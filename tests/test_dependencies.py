"""The dependency pins admit no release with a known hole that Curate's use reaches: Ray
without token auth (a job server that runs any code it is sent, docs/clusters.md) and
orjson with unbounded recursion on deep JSON (run.json, markers and ledgers are read and
written with it). And what is installed here satisfies the pins."""

from __future__ import annotations

import tomllib
from importlib.metadata import version

from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import ROOT

FLOORS = {  # package: (the first release with the fix, releases without it, why)
    "ray": ("2.52.0", ["2.50.0", "2.51.1"], "token auth (RAY_AUTH_MODE=token) first shipped in Ray 2.52.0"),
    "orjson": ("3.11.6", ["3.9.0", "3.9.14", "3.10.0", "3.11.5"], "orjson.loads recursed without limit before 3.9.15 "
               "(CVE-2024-27454), orjson.dumps before 3.11.6 (CVE-2025-67221)"),
}


def _pins() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {r.name: r for r in map(Requirement, deps)}


def test_the_pins_admit_no_release_without_the_fix_and_the_installed_ones_satisfy_them():
    pins = _pins()
    for name, (floor, older, why) in FLOORS.items():
        spec = pins[name].specifier
        assert all(Version(v) < Version(floor) for v in older)
        assert not [v for v in older if spec.contains(v)], f"{name}{spec} admits a release before {floor}: {why}"
        assert spec.contains(floor), f"{name}{spec} should admit {floor}, the first release with the fix"
        assert spec.contains(version(name)), f"{name} {version(name)} is installed, outside {spec}"
