"""Shared fixtures: the real demo corpus (built once), a real local Ray, YAML helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = Path(os.environ.get("CURATE_WHEEL_DIR") or ROOT / ".cache" / "wheels")


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory) -> Path:
    """The demo corpus with a smaller crawl: wiki (Parquet), web (JSONL.zst), code (JSONL.gz)."""
    from pipeline import demo_data

    out = tmp_path_factory.mktemp("demo")
    demo_data.build(out, wheel_dir=str(WHEEL_DIR), web_pages=3000)
    return out


@pytest.fixture(scope="session")
def wiki_texts(demo_corpus) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(demo_corpus / "wiki" / "summaries_en.parquet", columns=["text"]).column("text").to_pylist()


@pytest.fixture(scope="session")
def ray_local():
    """One real local Ray for the in-process runs of a test session."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    ray.shutdown()


def demo_mixture(demo_corpus: Path) -> str:
    """mixtures/demo.yaml as shipped, pointed at the test corpus. That corpus has a quarter
    of the crawl, so a smaller token target keeps web within max_epochs."""
    text = (ROOT / "mixtures" / "demo.yaml").read_text().replace("../data/demo", str(demo_corpus))
    return text.replace("target_tokens: 2000000", "target_tokens: 400000")


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def curate(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess (its own embedded Ray)."""
    e = {**os.environ, **(env or {})}
    e.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)
