"""Packing, best_fit against concat, on a run's own token files: documents cut, padding and
time, per sequence length (pipeline/steps/tokenize/pack.py, the code the writers run).

Reads each `tokenized/megatron/part-*` file of an unpacked run (one sequence a document),
packs its documents both ways, and reports: the share of documents cut across sequences
(a cut document's later pieces lose the context of its start), the share of the packed
tokens that are padding, and the packing's CPU time per million tokens.

    python -m bench.pack out/demo [--seq-lens 512,1024,2048,4096]

Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run with tokenized/megatron/ and no `pack` (e.g. out/demo)")
    ap.add_argument("--seq-lens", default="512,1024,2048,4096")
    a = ap.parse_args(argv)
    from pipeline.steps.tokenize.pack import pack

    files = []
    for b in sorted((a.run / "tokenized" / "megatron").glob("part-*.bin")):
        side = pq.read_table(b.with_name(b.name[: -len(".bin")] + ".docs.parquet"), columns=["start", "end"])
        lengths = side.column("end").to_numpy() - side.column("start").to_numpy()
        files.append((np.fromfile(b, np.uint16).astype(np.uint32), lengths))
    if not files:
        raise SystemExit(f"{a.run}/tokenized/megatron has no part-*.bin")
    docs = sum(len(x[1]) for x in files)
    tokens = sum(int(x[1].sum()) for x in files)
    print(f"{len(files)} files, {docs:,} documents, {tokens:,} tokens (median document {int(np.median(np.concatenate([x[1] for x in files]))):,})\n")
    print("| seq_len | strategy | documents cut | padding | CPU s per M tokens |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for seq_len in (int(x) for x in a.seq_lens.split(",")):
        for strategy in ("concat", "best_fit"):
            cut = packed = 0
            c = time.process_time()
            for ids, lengths in files:
                out, pc = pack(ids, lengths, seq_len, strategy, 50256)
                cut += int(np.sum(np.bincount(pc["doc"], minlength=len(lengths)) > 1))
                packed += len(out)
            cpu = time.process_time() - c
            print(f"| {seq_len:,} | {strategy} | {cut / docs:.2%} | {(packed - tokens) / packed:.2%} | {cpu / tokens * 1e6:.3f} |")


if __name__ == "__main__":
    main()
