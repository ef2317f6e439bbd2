"""The seconds each test file took (setup, call and teardown of its tests), for the order in
which `make test` hands files to its two processes (tests/conftest.py): the longest first,
so that no long file starts last and leaves one core idle at the end (pytest-xdist's own
order is by the number of tests in a file, which put the one-test fuzzing file last).

    python -m pytest tests -n 2 --dist loadfile --durations=0 > durations.log
    python -m tests.file_times durations.log          # rewrites tests/file_times.json

A file missing from the JSON (a new one) counts as 5 s; the figures need only be roughly right."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

JSON = Path(__file__).with_name("file_times.json")
LINE = re.compile(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+?)::")


def parse(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for ln in text.splitlines():
        if m := LINE.match(ln):
            out[m[2]] = out.get(m[2], 0.0) + float(m[1])
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def load() -> dict[str, float]:
    try:
        return json.loads(JSON.read_text())
    except (OSError, ValueError):
        return {}


if __name__ == "__main__":
    times = parse(Path(sys.argv[1]).read_text())
    if not times:
        sys.exit(f"{sys.argv[1]}: no durations found (run pytest with --durations=0)")
    JSON.write_text(json.dumps(times, indent=0) + "\n")
    print(f"{JSON}: {len(times)} files, {sum(times.values()):.0f} s")
