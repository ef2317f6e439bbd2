"""Semantic dedup's comparison inside one cluster, from N to 4N members (issue 58, term 2):
all pairs (a cluster compared whole, as before `max_cluster_rows`) against the cluster split
by bisection into groups of at most `--most` (semantic.split_cluster), CPU seconds per member
and the duplicates found. The sample caps k at 5,000, so at 2.5 x 10^10 documents a cluster
is ~5 M members: what matters is how the cost per member grows with the cluster.

    python -m bench.semantic_split [--members 8000] [--scales 1,4] [--most 2000] [--dim 256]

Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pipeline.steps.dedup import semantic


def one(n: int, dim: int, most: int) -> dict:
    rng = np.random.default_rng(n)
    k = n // 20  # near-copies of earlier members
    base = rng.normal(size=(n - k, dim)).astype(np.float32)
    v = np.vstack([base, base[rng.integers(0, n - k, k)] + rng.normal(size=(k, dim)).astype(np.float32) * 0.02])
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    out = {"members": n}
    t = time.process_time()
    whole, _, _ = semantic.duplicates(v, 0.92)
    out["whole_s"], out["whole_found"] = time.process_time() - t, int(whole.sum())
    t = time.process_time()
    found = 0
    for g in semantic.split_cluster(v, most):
        found += int(semantic.duplicates(v[g], 0.92)[0].sum())
    out["split_s"], out["split_found"] = time.process_time() - t, found
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=8000)
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--most", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=256)
    a = ap.parse_args(argv)
    rows = [one(a.members * int(s), a.dim, a.most) for s in a.scales.split(",")]
    print(f"| members | all pairs: CPU s | µs a member | found | groups of <= {a.most:,}: CPU s | µs a member | found |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['members']:,} | {r['whole_s']:.2f} | {1e6 * r['whole_s'] / r['members']:.0f} | {r['whole_found']:,} "
              f"| {r['split_s']:.2f} | {1e6 * r['split_s'] / r['members']:.0f} | {r['split_found']:,} |")
    a0, b0 = rows[0], rows[-1]
    print(f"\n{b0['members'] // a0['members']}x members: CPU per member all pairs "
          f"{(b0['whole_s'] / b0['members']) / (a0['whole_s'] / a0['members']):.2f}x, split "
          f"{(b0['split_s'] / b0['members']) / (a0['split_s'] / a0['members']):.2f}x; found by the split "
          f"{b0['split_found'] / max(1, b0['whole_found']):.3f} of all pairs' at 4N")


if __name__ == "__main__":
    main()
