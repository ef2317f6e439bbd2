"""A merge task's memory for its maps' offset indexes, from P to 4P partitions (issue 58,
term 1): `shuffle.merge` of G maps, each with P partitions (a few rows in a few of them),
run in a fresh process each time, its peak RSS over the same merge of 1 partition.

    python -m bench.merge_index [--maps 64] [--partitions 20000] [--scales 1,4] [--window-mb 4]

Whole indexes (the merge before: every map's index read whole, G x (P + 1) x 8 bytes) against
windows of `--window-mb` (the product's INDEX_WINDOW is 64 MB; scaled down here as the other
benches scale groups down, so that the window is smaller than the indexes at these sizes).
Also the bytes of the output, which must be the same. Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, resource, sys
import numpy as np, pyarrow as pa
from pathlib import Path
from pipeline.shards import shuffle
d, maps, window = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
shuffle.merge(d / "maps", 0, maps, shuffle.map_file(d / f"out-{window}", 0), index_window=window)
print(json.dumps({"peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "before_kb": before}))
"""


def _maps(d: Path, maps: int, nparts: int) -> None:
    import numpy as np
    import pyarrow as pa

    from pipeline.shards import shuffle

    rng = np.random.default_rng(0)
    for i in range(maps):
        n = 200
        t = pa.table({"k": rng.integers(0, 1 << 40, n, dtype=np.int64)})
        shuffle.write_partitions(t, np.sort(rng.integers(0, nparts, n)), nparts, shuffle.map_file(d / "maps", i))


def _merge(d: Path, maps: int, window: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(d), str(maps), str(window)], capture_output=True, text=True,
                       check=True)
    out = json.loads(r.stdout)
    from pipeline.shards import shuffle

    base = shuffle.map_file(d / f"out-{window}", 0)
    out["sha"] = hashlib.sha256(shuffle._with(base, ".data").read_bytes()
                                + shuffle._with(base, ".index").read_bytes()).hexdigest()[:16]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--maps", type=int, default=64)
    ap.add_argument("--partitions", type=int, default=20000)
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--window-mb", type=float, default=4)
    a = ap.parse_args(argv)
    rows = []
    for s in a.scales.split(","):
        p = a.partitions * int(s)
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            _maps(d, a.maps, p)
            whole = _merge(d, a.maps, 1 << 40)
            windowed = _merge(d, a.maps, int(a.window_mb * 2**20))
            rows.append((p, whole, windowed))
    print(f"| partitions | maps | index bytes | peak MB, whole indexes | peak MB, {a.window_mb:g} MB windows | same bytes |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for p, w, v in rows:
        print(f"| {p:,} | {a.maps} | {a.maps * (p + 1) * 8 / 2**20:.1f} MB | {w['peak_kb'] / 1024:.0f} | "
              f"{v['peak_kb'] / 1024:.0f} | {w['sha'] == v['sha']} |")
    (p0, w0, v0), (p1, w1, v1) = rows[0], rows[-1]
    print(f"\n{p1 // p0}x partitions: peak RSS whole {w1['peak_kb'] / w0['peak_kb']:.2f}x, "
          f"windowed {v1['peak_kb'] / v0['peak_kb']:.2f}x")


if __name__ == "__main__":
    main()
