"""Levanter caches (tokenize.formats: [levanter]) against the Megatron writer, in one run.

    python -m bench.levanter chain     # the demo mixture with formats [megatron, levanter], layout mixture and cells:
                                       # task CPU of the Levanter steps against Megatron's, per run and per token
    python -m bench.levanter writer    # the chunk writer alone at N and 4N tokens (N = one chunk, 134 M ids):
                                       # peak memory and CPU per token of each chunk task, a fresh process each,
                                       # against Megatron's .bin/.idx writer on the same documents

The chain's figure is what a user pays: the Levanter steps read what the Megatron step reads
(a mixture shard's partition, or for layout cells a document shard's ids), write pieces, then
the chunk files (blosc at level 5, as Levanter's metadata says); the Megatron step writes its
.bin/.idx. CPU is the tasks' own (`cpu_seconds` in the markers: every thread of the worker,
tensorstore's and blosc's included). The writer's memory must not grow from N to 4N: a task
holds one chunk (134 M ids at most, Levanter's chunk grid) whatever the cache's size.
bench/levanter_reader.py, the oracle the tests read the caches with, checks the caches here too.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def chain(work: Path) -> list[dict]:
    from bench.steps import step_cpu

    rows = []
    demo = (ROOT / "mixtures" / "demo.yaml").read_text().replace("../data/demo", str(ROOT / "data" / "demo"))
    assert "target_tokens: 2000000" in demo and "max_epochs: 3 " in demo, "mixtures/demo.yaml changed: update the bench"
    for layout, scale in (("mixture", 1), ("mixture", 4), ("cells", 1)):
        # 4N: a mixture of 8 M tokens from the same 3.4 M available (more epochs): the writers' work grows, the cells' not
        base = demo.replace("target_tokens: 2000000", f"target_tokens: {2000000 * scale}").replace(
            "max_epochs: 3 ", "max_epochs: 30 ")
        out = work / f"{layout}{scale}"
        text = base.replace("output: ../out", f"output: {out}").replace(
            "formats: [megatron, memmap]", f"formats: [megatron, levanter]\n  layout: {layout}").replace(
            "dir: ../out/_published/{name}", f"dir: {out}/published/{{name}}")
        y = work / f"{layout}.yaml"
        y.write_text(text)
        r = subprocess.run([sys.executable, "-m", "pipeline", "run", str(y), "--quiet"], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(r.stderr[-3000:])
        _, steps = step_cpu(out, "demo")
        m = json.loads((out / "demo" / "manifest.json").read_text())["tokenized"]["formats"]
        lev = sum(v for k, v in steps.items() if k.startswith("tokens-levanter"))
        meg = sum(v for k, v in steps.items() if k.startswith("tokens-megatron"))
        lt = m["levanter"]["tokens"] + m["levanter"]["validation_tokens"]
        mt = m["megatron"]["tokens"] + m["megatron"].get("validation_tokens", 0)
        rows.append({"layout": layout, "scale": scale, "levanter_cpu": round(lev, 2), "megatron_cpu": round(meg, 2),
                     "levanter_tokens": lt, "megatron_tokens": mt, "ratio": round(lev / meg, 2),
                     "ratio_per_token": round((lev / lt) / (meg / mt), 2),
                     "pieces": round(steps.get("tokens-levanter", 0) + steps.get("tokens-levanter-validation", 0), 2),
                     "chunks": round(steps.get("tokens-levanter-cache", 0), 2)})
    return rows


def _demo_tokens() -> tuple[np.ndarray, np.ndarray]:
    """Real GPT-2 ids and document lengths: the demo run's Megatron files (make demo)."""
    ids, lens = [], []
    for b in sorted((ROOT / "out" / "demo" / "tokenized" / "megatron").glob("part-*.bin")):
        ids.append(np.fromfile(b, np.uint16))
        idx = b.with_suffix(".idx").read_bytes()
        n = int(np.frombuffer(idx[18:26], np.uint64)[0])
        lens.append(np.frombuffer(idx[34:34 + 4 * n], np.int32).astype(np.int64))
    if not ids:
        raise SystemExit("no out/demo/tokenized/megatron files: run `make demo` first")
    return np.concatenate(ids), np.concatenate(lens)


def _pieces(folder: Path, total: int, per_piece: int, short: bool = False) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids, lens = _demo_tokens()
    if short:  # spam, titles, chat turns: 33 tokens a document, 8x the offsets a token of the demo's
        lens = np.full(len(ids) // 33, 33, np.int64)
    pieces, made, k = [], 0, 0
    while made < total:
        want = min(per_piece, total - made)
        reps = -(-want // len(ids))
        t = np.tile(ids, reps)[:want]
        ls = np.tile(lens, reps + 1)
        ends = np.cumsum(ls)
        ends = np.r_[ends[ends < want], want]  # the documents wholly inside, the last one cut to fit
        base = folder / f"piece-{k:05d}"
        t.astype("<u2").tofile(str(base) + ".ids")
        pq.write_table(pa.table({"end": ends.astype(np.int64)}), str(base) + ".docs.parquet")
        pieces.append({"path": str(base), "rows": len(ends), "tokens": want, "lengths": str(base) + ".docs.parquet"})
        made, k = made + want, k + 1
    return pieces


def _peak_mb() -> float:
    """The process's peak resident memory since its exec (VmHWM: ru_maxrss would keep the
    forking parent's, which a fork child starts with)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run_chunk(spec: dict, out_dir: str, index: int, q) -> None:
    from pipeline.engine.step import ShardOutput
    from pipeline.steps.tokenize import levanter

    c0 = time.process_time()
    levanter.cache_chunk(spec, ShardOutput(out_dir, index))
    q.put((time.process_time() - c0, _peak_mb()))


def _run_megatron(pieces: list[dict], out_dir: str, q) -> None:
    import pyarrow.parquet as pq

    from pipeline.steps.tokenize import formats

    c0 = time.process_time()
    for i, p in enumerate(pieces):
        ids = np.fromfile(p["path"] + ".ids", np.uint16)
        ends = pq.read_table(p["lengths"]).column("end").to_numpy()
        formats.write("megatron", Path(out_dir) / f"part-{i:05d}", ids, np.diff(np.r_[0, ends]), "uint16", "gpt2")
    q.put((time.process_time() - c0, _peak_mb()))


def _child(target, *args) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    got = q.get()
    p.join()
    return got


def writer(work: Path, n: int) -> list[dict]:
    from bench.levanter_reader import Cache
    from pipeline.steps.tokenize import levanter

    rows = []
    for kind, scale in (("demo", 1), ("demo", 4), ("short", 1), ("short", 4)):
        folder = work / f"{kind}{scale}"
        folder.mkdir(parents=True)
        pieces = _pieces(folder, n * scale, 25_000_000, short=kind == "short")
        specs = levanter.plan_chunks("c", [{k: p[k] for k in ("path", "rows", "tokens")} for p in pieces])
        cpu, peak, out = 0.0, 0.0, folder / "out"
        for i, sp in enumerate(specs):
            c, m = _child(_run_chunk, {**sp, "ids": "uint16"}, str(out), i)
            cpu, peak = cpu + c, max(peak, m)
        cache = out / "c"
        (cache / "shard_ledger.json").write_bytes(levanter.ledger(sum(p["rows"] for p in pieces), {}, {}))
        c = Cache(str(cache))
        assert c.data_size == n * scale and c.num_rows == sum(p["rows"] for p in pieces)
        mc, mm = _child(_run_megatron, pieces, str(folder / "megatron"))
        rows.append({"documents": kind, "tokens": n * scale, "chunk_tasks": len(specs), "levanter_cpu_ns_per_token": round(cpu / (n * scale) * 1e9, 2),
                     "levanter_peak_mb": round(peak), "megatron_cpu_ns_per_token": round(mc / (n * scale) * 1e9, 2),
                     "megatron_peak_mb": round(mm), "ratio": round(cpu / mc, 2)})
        shutil.rmtree(folder)
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    what = argv[0] if argv else "chain"
    work = Path(tempfile.mkdtemp(prefix="lev-", dir="/tmp"))
    try:
        if what == "chain":
            rows = chain(work)
        else:
            from pipeline.steps.tokenize import levanter

            rows = writer(work, int(argv[1]) if len(argv) > 1 else levanter.CHUNK)
        for r in rows:
            print(json.dumps(r))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
